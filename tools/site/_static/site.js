/* The series' site, on top of the book theme (tools/site/conf.py; loaded deferred on every page).
 *
 * A notebook's figure spans the text column and the margin beside it, where the page's contents sit
 * (tools/site/figure_links.py, _static/site.css). While any such figure is on the screen the contents fold into
 * their "Contents" line (hovering it unfolds them), so that no figure is drawn under them: the theme folds them
 * only once a wide element is in the upper two thirds of the screen, leaving one lower down half covered.
 */
(() => {
  "use strict";
  const contents = document.querySelector(".bd-sidebar-secondary");
  const figures = document.querySelectorAll(".cell_output.wide-figure");
  if (!contents || !figures.length || !("IntersectionObserver" in window)) return;
  const shown = new Set();
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (entry.isIntersecting) shown.add(entry.target);
      else shown.delete(entry.target);
    }
    contents.classList.toggle("figure-in-view", shown.size > 0);
  });
  figures.forEach((figure) => observer.observe(figure));
})();
