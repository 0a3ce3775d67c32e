"""TeX as plain text, for the excerpts the site's search shows: ``\\frac{QK^\\top}{\\sqrt{d}}`` -> ``QKᵀ/√d``.

An excerpt is text (the search page typesets nothing), and a formula's TeX in it reads as noise. This covers the
commands the series' formulas use; any other command loses its backslash and keeps its name.
"""

from __future__ import annotations

import re
import unicodedata

TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[{}\[\]^_]|[^\\{}\[\]^_]+")
SYMBOLS = {
    "cdot": "·", "times": "×", "top": "ᵀ", "ell": "ℓ", "dots": "…", "ldots": "…", "cdots": "⋯", "partial": "∂",
    "infty": "∞", "sum": "∑", "prod": "∏", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠",
    "approx": "≈", "in": "∈", "to": "→", "rightarrow": "→", "leftarrow": "←", "mapsto": "↦", "Longrightarrow": "⟹",
    "pm": "±", "odot": "⊙", "otimes": "⊗", "propto": "∝", "lesssim": "≲", "sim": "∼", "mid": "|", "lvert": "|",
    "rvert": "|", "vert": "|", "lVert": "‖", "rVert": "‖", "Vert": "‖", "langle": "⟨", "rangle": "⟩", "bmod": " mod ",
    "varepsilon": "ε", "epsilon": "ϵ", "varphi": "φ", "nabla": "∇", "forall": "∀", "exists": "∃", "sqrt": "√",
    ",": " ", ";": " ", ":": " ", " ": " ", "quad": "  ", "qquad": "  ", "!": "", "\\": "; ", "&": "&", "%": "%",
    "_": "_", "{": "{", "}": "}", "#": "#", "$": "$",
}  # fmt: skip
DROPPED = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "displaystyle", "limits"}
RELATIONS = {"le", "leq", "ge", "geq", "ne", "neq", "approx", "in", "to", "rightarrow", "leftarrow", "mapsto", "propto"}
RELATIONS |= {"Longrightarrow", "lesssim", "sim", "times", "cdot", "pm", "odot", "otimes"}  # and binary operators
FONTS = {"mathrm", "text", "operatorname", "mathbf", "mathit", "mathsf", "mathtt", "boldsymbol", "mathcal", "textbf"}
BLACKBOARD = {"R": "ℝ", "N": "ℕ", "Z": "ℤ", "Q": "ℚ", "C": "ℂ", "E": "𝔼"}
ACCENTS = {"hat": "\u0302", "widehat": "\u0302", "bar": "\u0304", "overline": "\u0304", "tilde": "\u0303"}


def greek(name: str) -> str | None:
    """The Greek letter a command names (``\\alpha`` -> α, ``\\Delta`` -> Δ), or None."""
    case = "CAPITAL" if name[0].isupper() else "SMALL"
    try:
        return unicodedata.lookup(f"GREEK {case} LETTER {name.upper()}")
    except KeyError:
        return None


def grouped(text: str) -> str:
    """``text`` in parentheses when it is more than one term, to stand as a fraction's part or under a root."""
    return f"({text})" if re.search(r"[\s+\-−·×/=,]", text.strip()) else text.strip()


class Reader:
    """A recursive reader over the tokens of a formula."""

    def __init__(self, tex: str):
        self.tokens, self.at = TOKEN.findall(tex), 0

    def argument(self) -> str:
        """The next argument: a braced group, or one token."""
        while self.at < len(self.tokens) and self.tokens[self.at].isspace():
            self.at += 1
        if self.at >= len(self.tokens):
            return ""
        token = self.tokens[self.at]
        self.at += 1
        if token == "{":
            return self.until("}")
        if token.startswith("\\"):
            return self.command(token[1:])
        if len(token) > 1:  # an argument is one character: the rest is read after it
            self.tokens.insert(self.at, token[1:])
        return token[0]

    def until(self, end: str | None) -> str:
        """Text up to the token ``end`` (consumed) or the end of the formula."""
        parts = []
        while self.at < len(self.tokens):
            token = self.tokens[self.at]
            self.at += 1
            if token == end:
                break
            if token.startswith("\\"):
                parts.append(self.command(token[1:]))
            elif token in ("^", "_"):
                script = self.argument().strip()
                parts.append("ᵀ" if script == "ᵀ" else token + (script if len(script) == 1 else f"({script})"))
            elif token not in ("{", "}"):  # & aligns
                parts.append(token.replace("&", ""))
        return "".join(parts)

    def command(self, name: str) -> str:
        if name == "frac" or name in ("tfrac", "dfrac"):
            top, bottom = self.argument(), self.argument()
            return f"{grouped(top)}/{grouped(bottom)}"
        if name == "sqrt":
            return "√" + grouped(self.argument())
        if name in FONTS:
            return self.argument()
        if name == "mathbb":
            letter = self.argument()
            return BLACKBOARD.get(letter, letter)
        if name in ACCENTS:
            return self.argument() + ACCENTS[name]
        if name in ("begin", "end"):
            self.argument()
            return ""
        if name == "underbrace":
            return self.argument()
        if name in DROPPED:
            return ""
        if name in RELATIONS:
            return f" {SYMBOLS[name]} "
        return SYMBOLS[name] if name in SYMBOLS else greek(name) or name


def tex_to_text(tex: str) -> str:
    """Readable plain text for the TeX of a formula, its delimiters (``\\( \\)``, ``\\[ \\]``, ``$``) dropped."""
    body = re.sub(r"^\s*(\\\(|\\\[|\$\$?)|(\\\)|\\\]|\$\$?)\s*$", "", tex)
    return re.sub(r"\s+", " ", Reader(body).until(None)).strip()
