"""Stimuli for the VWF-unit experiment, all generated offline and deterministic per seed.

Images are grey [32, 128] float32 in [0, 1]: background 0, ink 1 (line drawings and glyphs
alike, so the categories differ in shape, not in brightness statistics by construction). The
background is 0 so that a blank patch embeds to 0 in the ViT's bias-free patch embedding and
ink is the only content a token carries: with background -1 every token held a shared -W 1
as large as the ink's signal and the `cpu` size stayed at its task priors (README).

  words          from the PyPI package `english-words` (2.0.x): `dictionary()` every lowercase
                 a-z word of its "web2" or "gcide" list (the exclusion set), `word_list(min_len,
                 max_len)` the stimulus words, those in both lists (fewer rare forms).
  pseudowords    a letter-bigram Markov chain fit on the word list (`BigramChain`), sampled
                 with dictionary exclusion against the whole `dictionary()` (never a word of
                 either list) and at least one vowel: plausible non-words, as ROAR's.
  rendering      `render_text(text, font, rng)` with Pillow in the DejaVu / STIX / Computer
                 Modern fonts that ship inside matplotlib (`FONTS`: 12 for training;
                 `HELD_OUT_FONTS`: 3 never trained on);
                 OpenDyslexic and Comic Neue have no PyPI package, so the font-sensitivity
                 readout uses the held-out matplotlib fonts instead. Text that does not fit
                 at the smallest size raises (never clipped).
  localiser      `localiser_images(category, n, seed)`, categories `CATEGORIES`: "word",
                 "scrambled_word" (the same rendered words with their 4x4 pixel tiles shuffled
                 inside the ink's bounding box: same ink, same place, no letters), "face"
                 (procedural line faces: head ellipse, eyes, nose, mouth arc), "object" (line
                 drawings: random polylines, rectangles, ellipses, triangles).
  tasks          `shape_comparison(rng)`: circles and squares, "more circles than squares?"
                 (a non-reading visual task, ties excluded); `sentence_picture(rng)`: two
                 shapes side by side and a sentence in text ("circle left of square") that
                 matches the picture or not. The re-test's tasks on the localiser's own
                 images: `face(rng, smile=False)` (a frown), `line_object_parts` (the parts'
                 kinds), `ink_width` (a scrambled string's extent).
"""

import functools
import string
from pathlib import Path

import matplotlib
import numpy as np
from english_words import get_english_words_set
from PIL import Image, ImageDraw, ImageFont

HEIGHT, WIDTH = 32, 128
LETTERS = string.ascii_lowercase
VOWELS = set("aeiouy")
FONT_DIR = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
# Training typefaces: twelve of the families matplotlib ships (until part 5 only the first
# three, whose model read its lexicon in them but not in an unseen typeface: README).
FONTS = (
    "DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf",
    "DejaVuSerif-Bold.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSerif-Italic.ttf",
    "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "cmr10.ttf", "cmss10.ttf", "cmb10.ttf",
)  # fmt: skip
HELD_OUT_FONTS = ("DejaVuSans-Oblique.ttf", "STIXGeneral.ttf", "cmtt10.ttf")
CATEGORIES = ("word", "scrambled_word", "face", "object")
SHAPES = ("circle", "square", "triangle")
FONT_SIZES = (14, 18)  # the size range a word is drawn at, shrunk to fit (never below MIN)
MIN_FONT_SIZE = 8


# ----------------------------------------------------------------------------- words


@functools.cache
def _english_words(source: str) -> frozenset[str]:
    words = get_english_words_set([source], lower=True, alpha=True)
    return frozenset(w for w in words if w.isascii() and w.isalpha() and w.islower())


@functools.cache
def dictionary() -> frozenset[str]:
    """Every lowercase a-z word of english-words' "web2" or "gcide" list (~260k): the
    exclusion set for pseudowords."""
    return _english_words("web2") | _english_words("gcide")


@functools.cache
def word_list(min_len: int = 3, max_len: int = 7) -> tuple[str, ...]:
    """Sorted words of both lists with min_len <= length <= max_len (28k for 3-7)."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    both = _english_words("web2") & _english_words("gcide")
    return tuple(sorted(w for w in both if min_len <= len(w) <= max_len))


class BigramChain:
    """P(next letter | letter) with "^" (start) and "$" (end), counted on `words` with add-0
    smoothing (only bigrams that occur in real words are ever produced)."""

    def __init__(self, words):
        symbols = "^" + LETTERS + "$"
        self.index = {c: i for i, c in enumerate(symbols)}
        self.symbols = symbols
        counts = np.zeros((len(symbols), len(symbols)))
        for word in words:
            chain = "^" + word + "$"
            for a, b in zip(chain, chain[1:], strict=False):
                counts[self.index[a], self.index[b]] += 1
        totals = counts.sum(axis=1, keepdims=True)
        self.probs = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)

    def sample(self, rng: np.random.Generator, count: int, max_len: int) -> list[str | None]:
        """count letter strings drawn side by side (one uniform per string and step, inverse
        CDF); None for a string that runs past max_len before ending."""
        cdf = np.cumsum(self.probs, axis=1)
        end = self.index["$"]
        state = np.full(count, self.index["^"])
        letters = np.zeros((count, max_len + 1), np.int64)
        done = np.zeros(count, bool)
        length = np.full(count, -1)
        for step in range(max_len + 1):
            u = rng.random(count)
            # searchsorted row by row; min() guards u above a row's rounded total
            state = np.minimum((u[:, None] >= cdf[state]).sum(1), len(self.symbols) - 1)
            ended = ~done & (state == end)
            length[ended] = step
            done |= ended
            letters[:, step] = state
        return [
            "".join(self.symbols[i] for i in row[:n]) if n >= 0 else None
            for row, n in zip(letters, length, strict=True)
        ]


def pseudowords(n: int, seed: int, *, min_len: int = 3, max_len: int = 7) -> list[str]:
    """n distinct pseudowords: bigram-chain samples of the right length that are not in
    `dictionary()`. Raises if 80 n (at least 81920) draws do not give n."""
    chain = _chain(min_len, max_len)
    rng = np.random.default_rng(seed)
    words, seen = dictionary(), set()
    out = []
    # Fixed-size draws, so a seed's first k pseudowords do not depend on n.
    for _ in range(20 + 80 * n // 4096):
        for s in chain.sample(rng, 4096, max_len):
            if len(out) == n:
                return out
            if s is None or len(s) < min_len or s in words or s in seen or not set(s) & VOWELS:
                continue
            seen.add(s)
            out.append(s)
    if len(out) < n:
        raise ValueError(f"only {len(out)} of {n} pseudowords of length {min_len}-{max_len}")
    return out


@functools.cache
def _chain(min_len, max_len):
    return BigramChain(word_list(min_len, max_len))


# ----------------------------------------------------------------------------- rendering


@functools.cache
def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    path = FONT_DIR / name
    if not path.is_file():
        raise ValueError(f"font {name!r} not found in matplotlib's fonts ({FONT_DIR})")
    return ImageFont.truetype(str(path), size)


def to_array(image: Image.Image) -> np.ndarray:
    """An 8-bit grey image (0 background, 255 ink) -> float32 [H, W] in [0, 1]."""
    return np.asarray(image, np.float32) / 255.0


def render_text(
    text: str, font_name: str, rng: np.random.Generator, jitter: float = 1.0
) -> np.ndarray:
    """`text` drawn once at a random size in FONT_SIZES (shrunk until it fits with a 2-pixel
    margin) and a random position where it fits: float32 [32, 128] in [0, 1].

    jitter in [0, 1] scales the randomness (the training curriculum): 0 draws every string at
    the largest size, left-aligned and centred vertically; 1 is the full random size and
    place. The same draws are made at every jitter, so jitter 1 is the plain rendering."""
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter must be in [0, 1], got {jitter}")
    drawn = int(rng.integers(FONT_SIZES[0], FONT_SIZES[1] + 1))
    size = round(FONT_SIZES[1] - jitter * (FONT_SIZES[1] - drawn))
    while True:
        face = font(font_name, size)
        left, top, right, bottom = face.getbbox(text)
        w, h = right - left, bottom - top
        if w <= WIDTH - 4 and h <= HEIGHT - 4:
            break
        if size == MIN_FONT_SIZE:
            raise ValueError(f"text {text!r} does not fit a {HEIGHT}x{WIDTH} image")
        size -= 1
    free_x, free_y = WIDTH - 4 - w, HEIGHT - 4 - h
    dx, dy = int(rng.integers(0, free_x + 1)), int(rng.integers(0, free_y + 1))
    x = 2 + round(jitter * dx) - left
    y = 2 + round(free_y / 2 + jitter * (dy - free_y / 2)) - top
    image = Image.new("L", (WIDTH, HEIGHT), 0)
    ImageDraw.Draw(image).text((x, y), text, fill=255, font=face)
    return to_array(image)


def scramble(image: np.ndarray, rng: np.random.Generator, tile: int = 4) -> np.ndarray:
    """The tile x tile pixel tiles inside the ink's bounding box (on the tile grid) permuted at
    random: the same pixels in the same region with the letters' shapes destroyed."""
    ink = np.argwhere(image > 0.0)
    if ink.size == 0:
        return image.copy()
    (r0, c0), (r1, c1) = ink.min(0) // tile, ink.max(0) // tile + 1
    region = image[r0 * tile : r1 * tile, c0 * tile : c1 * tile]
    rows, cols = r1 - r0, c1 - c0
    tiles = region.reshape(rows, tile, cols, tile).transpose(0, 2, 1, 3).reshape(-1, tile, tile)
    tiles = tiles[rng.permutation(len(tiles))]
    out = image.copy()
    out[r0 * tile : r1 * tile, c0 * tile : c1 * tile] = (
        tiles.reshape(rows, cols, tile, tile).transpose(0, 2, 1, 3).reshape(region.shape)
    )
    return out


# ----------------------------------------------------------------------------- drawings


def _canvas():
    image = Image.new("L", (WIDTH, HEIGHT), 0)
    return image, ImageDraw.Draw(image)


def _ellipse(draw, cx, cy, rx, ry, width=1):
    draw.ellipse((cx - rx, cy - ry, cx + rx, cy + ry), outline=255, width=width)


def face(rng: np.random.Generator, smile: bool = True) -> np.ndarray:
    """A line-drawn face: head ellipse, two eyes, a nose line, a mouth arc, sizes and place
    at random. smile False turns the mouth arc over (a frown on the same rows, so only its
    shape tells them apart: the re-test's face task); the draws are the same either way."""
    image, draw = _canvas()
    ry = rng.uniform(11, 15)
    rx = ry * rng.uniform(0.7, 1.0)
    cx, cy = rng.uniform(rx + 1, WIDTH - rx - 2), HEIGHT / 2 + rng.uniform(-1, 1)
    _ellipse(draw, cx, cy, rx, ry)
    eye_dx, eye_y, eye_r = rx * rng.uniform(0.3, 0.5), cy - ry * rng.uniform(0.2, 0.4), 1.5
    for side in (-1, 1):
        _ellipse(draw, cx + side * eye_dx, eye_y, eye_r + rng.uniform(0, 1), eye_r)
    draw.line((cx, eye_y + 2, cx + rng.uniform(-1.5, 1.5), cy + ry * 0.15), fill=255)
    mouth_w, mouth_y = rx * rng.uniform(0.4, 0.7), cy + ry * rng.uniform(0.35, 0.5)
    box = (cx - mouth_w, mouth_y - 3, cx + mouth_w, mouth_y + 3)
    if smile:  # the lower half of the box: rows mouth_y .. mouth_y + 3
        draw.arc(box, 0, 180, fill=255)
    else:  # the upper half of the box moved down 3: the same rows, turned over
        draw.arc((box[0], box[1] + 3, box[2], box[3] + 3), 180, 360, fill=255)
    return to_array(image)


OBJECT_PARTS = ("polyline", "rectangle", "ellipse", "triangle")


def line_object(rng: np.random.Generator) -> np.ndarray:
    """A line drawing of 2-4 random parts: polylines, rectangles, ellipses, triangles."""
    return line_object_parts(rng)[0]


def line_object_parts(rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """(`line_object`'s image, the kinds of its parts, `OBJECT_PARTS` names): the re-test's
    object task asks whether an ellipse is among them."""
    image, draw = _canvas()
    kinds = []
    for _ in range(int(rng.integers(2, 5))):
        kind = rng.integers(4)
        kinds.append(OBJECT_PARTS[kind])
        x0, y0 = rng.uniform(2, WIDTH - 20), rng.uniform(2, HEIGHT - 12)
        w, h = rng.uniform(6, 30), rng.uniform(6, HEIGHT - 4 - y0 + 2)
        x1, y1 = min(x0 + w, WIDTH - 2), min(y0 + h, HEIGHT - 2)
        if kind == 0:
            points = [(rng.uniform(x0, x1), rng.uniform(y0, y1)) for _ in range(4)]
            draw.line(points, fill=255)
        elif kind == 1:
            draw.rectangle((x0, y0, x1, y1), outline=255)
        elif kind == 2:
            draw.ellipse((x0, y0, x1, y1), outline=255)
        else:
            draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) / 2, y0)], outline=255)
    return to_array(image), kinds


def _shape(draw, kind: str, cx: float, cy: float, r: float, filled: bool = False):
    box = (cx - r, cy - r, cx + r, cy + r)
    fill = 255 if filled else None
    if kind == "circle":
        draw.ellipse(box, outline=255, fill=fill)
    elif kind == "square":
        draw.rectangle(box, outline=255, fill=fill)
    else:
        draw.polygon([(cx - r, cy + r), (cx + r, cy + r), (cx, cy - r)], outline=255, fill=fill)


def _places(rng, count: int, r: float, x_range=(0, WIDTH)) -> list[tuple[float, float]]:
    """count centres in x_range whose shapes of half-width r cannot touch: centres more than
    2 sqrt(2) r + 3 apart (two squares' corners) (rejection sampling, bounded)."""
    places, gap = [], 2 * np.sqrt(2) * r + 3
    for _ in range(1000 * count):
        if len(places) == count:
            return places
        x = rng.uniform(x_range[0] + r + 1, x_range[1] - r - 2)
        y = rng.uniform(r + 1, HEIGHT - r - 2)
        if all((x - a) ** 2 + (y - b) ** 2 > gap**2 for a, b in places):
            places.append((x, y))
    if len(places) == count:
        return places
    raise ValueError(f"could not place {count} shapes of half-width {r} apart")


def shape_comparison(rng: np.random.Generator) -> tuple[np.ndarray, int, tuple[int, int]]:
    """(image, label, (circles, squares)): 1-5 circles and 1-5 squares (unequal counts) drawn
    at random places; label 1 when there are more circles."""
    circles, squares = rng.choice(np.arange(1, 6), size=2, replace=False)
    image, draw = _canvas()
    r = 4.0
    kinds = ["circle"] * int(circles) + ["square"] * int(squares)
    for kind, (x, y) in zip(kinds, _places(rng, len(kinds), r), strict=True):
        _shape(draw, kind, x, y, r)
    return to_array(image), int(circles > squares), (int(circles), int(squares))


def sentence_picture(rng: np.random.Generator) -> tuple[np.ndarray, str, int]:
    """(image, sentence, label): shapes a and b drawn left and right; the sentence
    "<x> left of <y>" or "<x> right of <y>" is true of the picture (label 1) or false (0: the
    relation reversed, or a shape named that is not drawn), half and half."""
    a, b = rng.choice(SHAPES, size=2, replace=False)
    image, draw = _canvas()
    r = rng.uniform(6, 10)
    ((xa, ya),) = _places(rng, 1, r, (0, WIDTH / 2))
    ((xb, yb),) = _places(rng, 1, r, (WIDTH / 2, WIDTH))
    _shape(draw, a, xa, ya, r)
    _shape(draw, b, xb, yb, r)
    true = rng.random() < 0.5
    if rng.random() < 0.5:
        x, y = (a, b) if true else (b, a)
        sentence = f"{x} left of {y}"
    else:
        x, y = (b, a) if true else (a, b)
        sentence = f"{x} right of {y}"
    if not true and rng.random() < 0.5:  # a false sentence that names a shape not drawn
        (other,) = set(SHAPES) - {a, b}
        sentence = f"{other} left of {b}" if "left" in sentence else f"{other} right of {a}"
    return to_array(image), sentence, int(true)


# ----------------------------------------------------------------------------- localiser


def _word_picks(rng: np.random.Generator, pool_size: int, n: int) -> np.ndarray:
    """n indices into a pool of letter strings: distinct when the pool has n, else whole
    permutations of the pool one after another (each string at most ceil(n / pool) times)."""
    if n <= pool_size:
        return rng.choice(pool_size, size=n, replace=False)
    rounds = -(-n // pool_size)
    return np.concatenate([rng.permutation(pool_size) for _ in range(rounds)])[:n]


def localiser_strings(n: int, seed: int, words=None) -> list[str]:
    """The letter strings `localiser_images("word" | "scrambled_word", n, seed, words=...)`
    draws (the same draws, replayed): words from `words` (default `word_list()`)."""
    pool = word_list() if words is None else tuple(words)
    return [pool[i] for i in _word_picks(np.random.default_rng(seed), len(pool), n).tolist()]


def localiser_images(
    category: str, n: int, seed: int, *, fonts=FONTS, jitter: float = 1.0, words=None
) -> np.ndarray:
    """n images [n, 32, 128] of one localiser category (`CATEGORIES`). "word" and
    "scrambled_word" draw the same words and fonts for the same seed (only the scrambling
    differs), so the word - scrambled contrast is the letters' shapes alone; words: the pool
    they come from (default `word_list()`; the re-test: the taught lexicon); jitter: their
    size and place randomness, as the model reads (`render_text`)."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown localiser category {category!r}; expected one of {CATEGORIES}")
    rng = np.random.default_rng(seed)
    if category in ("word", "scrambled_word"):
        pool = word_list() if words is None else tuple(words)
        if not pool:
            raise ValueError("localiser words: the pool of letter strings is empty")
        picks = _word_picks(rng, len(pool), n)
        images = [
            render_text(pool[i], fonts[rng.integers(len(fonts))], rng, jitter)
            for i in picks.tolist()
        ]
        if category == "scrambled_word":
            scramble_rng = np.random.default_rng([seed, 1])
            images = [scramble(im, scramble_rng) for im in images]
    else:
        draw = face if category == "face" else line_object
        images = [draw(rng) for _ in range(n)]
    return np.stack(images).astype(np.float32)


def ink_width(image: np.ndarray) -> int:
    """Pixels from the leftmost to the rightmost inked column (0 for a blank image): what the
    re-test's scrambled-string task judges, a visual extent with no letters to read."""
    columns = np.flatnonzero((np.asarray(image) > 0).any(axis=0))
    return int(columns[-1] - columns[0] + 1) if columns.size else 0
