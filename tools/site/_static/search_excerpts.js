/* The search page's excerpts, also when the site is opened as a file (tools/site/search_excerpts.py).
 *
 * Sphinx's search (searchtools.js) fetch()es each page it lists to cut an excerpt from it. Opened from disk, a page
 * may fetch nothing, but it may load scripts: so a fetch of one of the site's pages is answered with what
 * _static/search-excerpts/<page>.js hands over (the page's text, formulas as plain text). Any other fetch, or a
 * page without its script, goes to the browser's fetch as before. Loaded on search.html only.
 */
(() => {
  "use strict";
  const root = new URL(document.documentElement.dataset.content_root || "./", window.location.href);
  const suffix = (window.DOCUMENTATION_OPTIONS && DOCUMENTATION_OPTIONS.FILE_SUFFIX) || ".html";
  const waiting = new Map(); // page name -> resolve, until its script has run
  const loaded = new Map(); // page name -> Promise of its HTML

  window.mhaSearchExcerpt = (page, html) => {
    const resolve = waiting.get(page);
    waiting.delete(page);
    if (resolve) resolve(html);
  };

  const excerpt = (page) => {
    if (!loaded.has(page)) {
      loaded.set(
        page,
        new Promise((resolve, reject) => {
          waiting.set(page, resolve);
          const script = document.createElement("script");
          script.src = new URL(`_static/search-excerpts/${page}.js`, root).href;
          script.onerror = () => reject(new Error(`no excerpt for ${page}`));
          script.onload = () => waiting.has(page) && reject(new Error(`${page}.js handed nothing over`));
          document.head.appendChild(script);
        }),
      );
    }
    return loaded.get(page);
  };

  // The page of the site that a URL names ("notebooks/01_scaled_dot_product_attention"), or null.
  const pageOf = (input) => {
    const url = new URL(typeof input === "string" ? input : input.url, window.location.href);
    url.search = "";
    url.hash = "";
    const path = url.href.startsWith(root.href) ? url.href.slice(root.href.length) : "";
    return path.endsWith(suffix) ? decodeURIComponent(path.slice(0, -suffix.length)) : null;
  };

  const browserFetch = window.fetch.bind(window);
  window.fetch = (input, init) => {
    const page = pageOf(input);
    if (page === null) return browserFetch(input, init);
    return excerpt(page).then(
      (html) => new Response(html, { headers: { "Content-Type": "text/html; charset=utf-8" } }),
      () => browserFetch(input, init),
    );
  };
})();
