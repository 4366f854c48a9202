// The "Attention" tab of TensorBoard: the frontend of the dynamic plugin `nmt_attention`.
//
// TensorBoard shows the tab as an iframe on data/plugin_entry.html?name=nmt_attention. That page
// has <base href="plugin/nmt_attention/">, imports this module and calls render(). Everything
// the page needs is fetched with URLs relative to that base:
//   ./runs                          -> [{run, sentences: [tag, ...]}]
//   ./steps?run=R&tag=T             -> [{step, wall_time}, ...]  (sorted by step)
//   ./attention?run=R&tag=T&step=S  -> the sample's header (tokens, texts, map list) + "weights"
//   ./static/viewer.css             -> the page's styles
// The page's Content-Security-Policy allows only same-origin scripts, so this file is plain
// JavaScript with no dependencies and no build step.
//
// How the weights are stored (one sample = one sentence at one evaluation step): `weights` is
// the base64 of bytes; each map ({kind, layer, heads, rows, cols, offset}) is heads x rows x cols
// bytes from `offset`, row-major, and a byte b stands for the weight b / 255. Rows are queries,
// columns are keys.
//
// Optional header fields (viewer/format.py), each drawn only when a sample has it:
//   gold: {sure: [[i, j], ...], possible: [...]}  a gold word alignment (i source word, j output
//                                                  word): boxes over the cross maps
//   links: [[i, j], ...], links_method: "..."      the model's own hard links: dots over them
//   head_stats: [per map: [per head: {entropy, importance}]]  numbers under each small map

// ----- constants ------------------------------------------------------------------------------

const MIN_CELL = 14; // px: below this the 12 px token labels overlap, so the map scrolls instead
const MAX_CELL = 48;
const DEFAULT_CELL = 24;
const THUMB_SIZE = 64; // px: the longer side of a small map in the layer x head grid
const PLAY_MS = 700; // the pause between steps while playing through training

const KIND_NAMES = {
  cross: "cross attention (output -> source)",
  encoder_self: "encoder self attention",
  decoder_self: "decoder self attention",
};

// ----- state ----------------------------------------------------------------------------------

// What the user picked. The second run (`compare`) shows the same sentence, kind, layer and
// head at the step of the first run, or at its nearest step.
const state = {
  runs: [], // [{run, sentences}] as ./runs gives them
  run: null, // the main run
  compare: "", // the run shown beside it, "" for none
  tag: null, // the sentence, e.g. "nmt_attention/sent0"
  step: null, // the main run's step; null: its last one
  steps: [], // the main run's steps for this sentence
  kind: "cross",
  layer: 1, // 1-based
  head: "mean", // "mean", "max" or a 1-based head number (as a string, like a <select> value)
  units: "subwords", // or "words"
  cell: DEFAULT_CELL, // px per map cell: the zoom
  gold: true, // draw the gold alignment over cross maps that have one
  links: true, // draw the model's own links over cross maps that have them
  order: "number", // the small maps of a layer by "number", "importance" or "entropy"
};

// Responses already fetched: steps by run and tag, samples by run, tag and step.
const cache = { steps: new Map(), samples: new Map() };

let updates = 0; // counts update() calls, so that a slow, outdated one does not draw over a newer
let player = null; // the interval timer while "play" walks through the steps

// The page's fixed elements, made by render().
const ui = {};

// ----- fetching -------------------------------------------------------------------------------

/** GET ./<route>?<params> as JSON; the server's {"error": ...} message becomes the Error's. */
async function fetchJson(route, params = {}) {
  const query = new URLSearchParams(params).toString();
  const response = await fetch(query ? `./${route}?${query}` : `./${route}`);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new Error(body.error || `${route}: HTTP ${response.status}`);
  }
  return body;
}

/** The steps of one run's sentence, fetched once. */
async function getSteps(run, tag) {
  const key = JSON.stringify([run, tag]);
  if (!cache.steps.has(key)) {
    cache.steps.set(key, await fetchJson("steps", { run, tag }));
  }
  return cache.steps.get(key);
}

/** One sample (header + decoded weight bytes), fetched once. */
async function getSample(run, tag, step) {
  const key = JSON.stringify([run, tag, step]);
  if (!cache.samples.has(key)) {
    const sample = await fetchJson("attention", { run, tag, step });
    sample.bytes = decodeBase64(sample.weights);
    delete sample.weights;
    cache.samples.set(key, sample);
  }
  return cache.samples.get(key);
}

/** base64 text -> Uint8Array. */
function decodeBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** The entry of `steps` whose step is `wanted`, else the nearest one; the last when `wanted` is null. */
function nearestStep(steps, wanted) {
  if (wanted === null) return steps[steps.length - 1].step;
  let best = steps[0].step;
  for (const { step } of steps) {
    if (Math.abs(step - wanted) < Math.abs(best - wanted)) best = step;
  }
  return best;
}

// ----- from bytes to the matrix that is shown -------------------------------------------------

/** The map of `kind` and `layer` in a sample, or undefined. */
function findMap(sample, kind, layer) {
  return sample.maps.find((m) => m.kind === kind && m.layer === layer);
}

/**
 * One rows x cols matrix of a map: a single head (`head` = "1", "2", ...) or the heads' mean or
 * max at each cell. Returns {rows, cols, values: Float64Array (row-major, weights in 0..1)}.
 */
function headMatrix(bytes, map, head) {
  const { heads, rows, cols, offset } = map;
  const size = rows * cols;
  const values = new Float64Array(size);
  const chosen = head === "mean" || head === "max" ? [...Array(heads).keys()] : [Number(head) - 1];
  for (const h of chosen) {
    const start = offset + h * size;
    for (let i = 0; i < size; i++) {
      const w = bytes[start + i] / 255;
      values[i] = head === "max" ? Math.max(values[i], w) : values[i] + w;
    }
  }
  if (head === "mean") for (let i = 0; i < size; i++) values[i] /= heads;
  return { rows, cols, values };
}

/**
 * Subword pieces -> words. `wordOf[i]` is the word index of piece i. A word's row is the mean of
 * its pieces' rows (a query word attends as its pieces do on average) and a word's column the
 * sum of its pieces' columns (the weight given to any piece of the word), so rows still sum to 1.
 */
function poolWords(matrix, rowWordOf, colWordOf) {
  const rows = Math.max(...rowWordOf) + 1;
  const cols = Math.max(...colWordOf) + 1;
  const values = new Float64Array(rows * cols);
  const pieces = new Array(rows).fill(0); // pieces per row word
  for (let r = 0; r < matrix.rows; r++) {
    pieces[rowWordOf[r]] += 1;
    for (let c = 0; c < matrix.cols; c++) {
      values[rowWordOf[r] * cols + colWordOf[c]] += matrix.values[r * matrix.cols + c];
    }
  }
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) values[r * cols + c] /= pieces[r];
  }
  return { rows, cols, values };
}

/** The words that pieces make: the pieces of one word joined, without the "▁" word marks. */
function wordLabels(pieces, wordOf) {
  const words = [];
  pieces.forEach((piece, i) => {
    words[wordOf[i]] = (words[wordOf[i]] || "") + piece.replaceAll("▁", "");
  });
  return words;
}

/**
 * The tokens (and their word indices) on the rows (queries) and columns (keys) of a kind.
 * Decoder self attention: row t is the query that predicts output token t, and it attends to
 * what the decoder was fed up to then: <s>, then the output tokens shifted by one.
 */
function axes(sample, kind) {
  const src = { pieces: sample.src_tokens, wordOf: sample.src_words };
  const out = { pieces: sample.out_tokens, wordOf: sample.out_words };
  if (kind === "encoder_self") return { rows: src, cols: src };
  if (kind === "cross") return { rows: out, cols: src };
  const fed = {
    pieces: sample.in_tokens || ["<s>", ...out.pieces.slice(0, -1)],
    wordOf: [0, ...out.wordOf.slice(0, -1).map((w) => w + 1)], // <s> is a word of its own
  };
  return { rows: out, cols: fed };
}

/** `pieces` cut or padded to `n` labels (a guard: a header whose tokens do not match its map). */
function fit(axis, n) {
  const pieces = Array.from({ length: n }, (_, i) => axis.pieces[i] ?? `#${i}`);
  const wordOf = Array.from({ length: n }, (_, i) => axis.wordOf[i] ?? i);
  return { pieces, wordOf };
}

/**
 * The matrix a panel shows for the current choices, with its labels:
 * {rows, cols, values, rowLabels, colLabels}, or {missing: "why this run has nothing to show"}.
 */
function shownMatrix(sample, choice) {
  const { kind, layer, head, units } = choice;
  const ofKind = sample.maps.filter((m) => m.kind === kind);
  if (!ofKind.length) {
    return { missing: `This ${sample.model} model has no ${KIND_NAMES[kind]}.` };
  }
  const map = findMap(sample, kind, layer);
  if (!map) {
    return { missing: `This ${sample.model} model has no layer ${layer} of ${KIND_NAMES[kind]} (it has ${ofKind.length}).` };
  }
  if (head !== "mean" && head !== "max" && Number(head) > map.heads) {
    return { missing: `This ${sample.model} model has ${map.heads} head(s) in layer ${layer}: no head ${head}.` };
  }
  const matrix = headMatrix(sample.bytes, map, head);
  const ax = axes(sample, kind);
  const rowAxis = fit(ax.rows, map.rows);
  const colAxis = fit(ax.cols, map.cols);
  if (units === "subwords") {
    return { ...matrix, rowLabels: rowAxis.pieces, colLabels: colAxis.pieces, rowWords: rowAxis.wordOf, colWords: colAxis.wordOf };
  }
  const pooled = poolWords(matrix, rowAxis.wordOf, colAxis.wordOf);
  return {
    ...pooled,
    rowLabels: wordLabels(rowAxis.pieces, rowAxis.wordOf),
    colLabels: wordLabels(colAxis.pieces, colAxis.wordOf),
    rowWords: [...Array(pooled.rows).keys()], // a row is a word
    colWords: [...Array(pooled.cols).keys()],
  };
}

// ----- word alignments over a cross map -------------------------------------------------------

/** `links` ([[i, j], ...]) each once, in their first order. */
function uniqueLinks(links) {
  const seen = new Set();
  return links.filter(([i, j]) => {
    const key = `${i}-${j}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/** [first, end) of the rows (or columns) whose word is `word`; null when none is. */
function wordSpan(wordOf, word) {
  const first = wordOf.indexOf(word);
  return first < 0 ? null : [first, wordOf.lastIndexOf(word) + 1];
}

/**
 * What is drawn over a cross map: one mark per link, {type: "sure" | "possible" | "link", link:
 * [i, j], top, bottom, left, right} (cells, ends exclusive), covering every piece of output word j
 * (rows) x every piece of source word i (columns). A possible link that is also sure is sure; a link
 * to a word the map lacks is left out.
 */
function alignmentMarks(sample, matrix) {
  const sure = uniqueLinks(sample.gold?.sure || []);
  const isSure = new Set(sure.map(([i, j]) => `${i}-${j}`));
  const possible = uniqueLinks(sample.gold?.possible || []).filter(([i, j]) => !isSure.has(`${i}-${j}`));
  const typed = [
    ...sure.map((link) => ["sure", link]),
    ...possible.map((link) => ["possible", link]),
    ...uniqueLinks(sample.links || []).map((link) => ["link", link]),
  ];
  const marks = [];
  for (const [type, link] of typed) {
    const rows = wordSpan(matrix.rowWords, link[1]);
    const cols = wordSpan(matrix.colWords, link[0]);
    if (rows && cols) marks.push({ type, link, top: rows[0], bottom: rows[1], left: cols[0], right: cols[1] });
  }
  return marks;
}

/** The marks of `marks` that cover cell (r, c). */
function marksAt(marks, r, c) {
  return marks.filter((m) => m.top <= r && r < m.bottom && m.left <= c && c < m.right);
}

// ----- the numbers of each head ---------------------------------------------------------------

/**
 * The numbers of each head of `map`, by head: {head (1-based), entropy (nats), importance (the
 * rise of the validation loss without it, or null), ofSentence}. From the header's head_stats
 * (measured over a validation set) when it has them, else the mean row entropy of this sentence's
 * stored map (ofSentence: true, no importance).
 */
function headNumbers(sample, map) {
  const stats = sample.head_stats?.[sample.maps.indexOf(map)];
  return Array.from({ length: map.heads }, (_, h) => {
    if (stats?.[h]) return { head: h + 1, entropy: stats[h].entropy, importance: stats[h].importance ?? null, ofSentence: false };
    return { head: h + 1, entropy: meanRowEntropy(sample.bytes, map, h), importance: null, ofSentence: true };
  });
}

/** The mean over the rows of head `h` (0-based) of `map` of the row's entropy in nats
 * (alignment/heads.py's row_entropy averaged over the rows, here of the stored 8-bit weights). */
function meanRowEntropy(bytes, map, h) {
  const { rows, cols, offset } = map;
  let total = 0;
  for (let i = offset + h * rows * cols, end = i + rows * cols; i < end; i++) {
    const w = bytes[i] / 255;
    if (w > 0) total -= w * Math.log(w);
  }
  return rows ? total / rows : 0;
}

/** A head's numbers under its small map, e.g. "H 1.42 · Δ+0.031" or "H 1.42 (this sentence)". */
function numbersText(n) {
  const entropy = `H ${n.entropy.toFixed(2)}`;
  if (n.ofSentence) return `${entropy} (this sentence)`;
  if (n.importance === null) return entropy;
  return `${entropy} · Δ${n.importance >= 0 ? "+" : ""}${n.importance.toFixed(3)}`;
}

/** The heads' numbers in the order `order` picks: by number, by importance (largest first, unmeasured
 * last) or by entropy (smallest, the most focused, first); ties by number. */
function orderHeads(numbers, order) {
  const key = {
    number: (n) => n.head,
    importance: (n) => (n.importance === null ? Infinity : -n.importance),
    entropy: (n) => n.entropy,
  }[order];
  return [...numbers].sort((a, b) => key(a) - key(b) || a.head - b.head);
}

// ----- drawing --------------------------------------------------------------------------------

// The viridis colour map (the one the project's matplotlib figures use), as 5 stops that are
// interpolated linearly: dark purple for 0, yellow for 1.
const VIRIDIS = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];

/** The CSS colour of a weight in 0..1. */
function colour(weight) {
  const x = Math.min(Math.max(weight, 0), 1) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const t = x - i;
  const [r, g, b] = VIRIDIS[i].map((v, k) => Math.round(v + t * (VIRIDIS[i + 1][k] - v)));
  return `rgb(${r}, ${g}, ${b})`;
}

/** Paint each cell of `matrix` as a `cell` x `cell` square whose top left corner is at (x0, y0). */
function paintCells(ctx, matrix, cell, x0 = 0, y0 = 0) {
  for (let r = 0; r < matrix.rows; r++) {
    for (let c = 0; c < matrix.cols; c++) {
      ctx.fillStyle = colour(matrix.values[r * matrix.cols + c]);
      ctx.fillRect(x0 + c * cell, y0 + r * cell, cell, cell);
    }
  }
}

/** A canvas of `width` x `height` CSS pixels, sharp on high-density screens; returns [canvas, ctx]. */
function sizedCanvas(width, height) {
  const canvas = document.createElement("canvas");
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  return [canvas, ctx];
}

/** Outline row `r` and column `c` of the drawn map, and the cell where they cross. */
function outlineCross(ctx, matrix, cell, r, c) {
  ctx.lineWidth = 2;
  ctx.strokeStyle = "#ff2d6f";
  ctx.strokeRect(1, r * cell + 1, matrix.cols * cell - 2, cell - 2);
  ctx.strokeRect(c * cell + 1, 1, cell - 2, matrix.rows * cell - 2);
  ctx.strokeStyle = "#ffffff";
  ctx.strokeRect(c * cell + 2, r * cell + 2, cell - 4, cell - 4);
}

// Gold boxes and model links: a dark line inside a white halo, readable over the dark (low) and
// the light (high) cells of viridis alike. A sure box is solid, a possible one thinner and dashed
// and further inside its cells (so that neighbouring boxes stay apart); a model link is a red dot
// in the middle of its cells. The SVG over the map (overlayElement) and the exported PNG
// (paintMarks) draw them alike from these numbers.
const MARK_STYLE = {
  sure: { inset: 2, halo: 4, line: 2, dash: [] },
  possible: { inset: 4, halo: 3.5, line: 1.5, dash: [4, 3] },
};
const LINK_COLOUR = "#e4002b";

/** The rectangle, in px, that a gold mark's line follows: its cells, shrunk by its inset. */
function markBox(mark, cell) {
  const inset = MARK_STYLE[mark.type].inset;
  return {
    x: mark.left * cell + inset,
    y: mark.top * cell + inset,
    width: Math.max((mark.right - mark.left) * cell - 2 * inset, 1),
    height: Math.max((mark.bottom - mark.top) * cell - 2 * inset, 1),
  };
}

/** The centre and radius, in px, of a model link's dot. */
function linkDot(mark, cell) {
  return {
    cx: ((mark.left + mark.right) / 2) * cell,
    cy: ((mark.top + mark.bottom) / 2) * cell,
    r: Math.max(3, cell * 0.18),
  };
}

/** Paint `marks` on a canvas whose map starts at (x0, y0). */
function paintMarks(ctx, marks, cell, x0 = 0, y0 = 0) {
  for (const mark of marks) {
    if (mark.type === "link") {
      const { cx, cy, r } = linkDot(mark, cell);
      ctx.beginPath();
      ctx.arc(x0 + cx, y0 + cy, r, 0, 2 * Math.PI);
      ctx.fillStyle = LINK_COLOUR;
      ctx.fill();
      ctx.lineWidth = 1.5;
      ctx.strokeStyle = "#ffffff";
      ctx.stroke();
      continue;
    }
    const style = MARK_STYLE[mark.type];
    const { x, y, width, height } = markBox(mark, cell);
    ctx.setLineDash(style.dash);
    for (const [colour, lineWidth] of [["#ffffff", style.halo], ["#000000", style.line]]) {
      ctx.strokeStyle = colour;
      ctx.lineWidth = lineWidth;
      ctx.strokeRect(x0 + x, y0 + y, width, height);
    }
    ctx.setLineDash([]);
  }
}

// ----- small DOM helpers ----------------------------------------------------------------------

/** A new element: `el("div", {className: "x", dataset: {...}, style: {...}}, child, "text", ...)`. */
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  const { dataset, style, ...rest } = props;
  Object.assign(node, rest);
  Object.assign(node.dataset, dataset || {});
  Object.assign(node.style, style || {});
  node.append(...children);
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** A new SVG element with the given attributes. */
function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

/** A <select> of [value, text] options, calling `onChange(value)` when the user picks one. */
function select(id, onChange) {
  const node = el("select", { id });
  node.addEventListener("change", () => onChange(node.value));
  return node;
}

/** Replace the options of `node` (only when they changed, not to disturb the user) and pick `value`. */
function setOptions(node, options, value) {
  const wanted = JSON.stringify(options);
  if (node.dataset.options !== wanted) {
    node.replaceChildren(...options.map(([v, text]) => el("option", { value: v, textContent: text })));
    node.dataset.options = wanted;
  }
  node.value = String(value);
}

/** A control with its label before it. */
function labelled(text, control) {
  return el("label", { className: "control" }, el("span", { textContent: text }), control);
}

function setStatus(text, isError = false) {
  ui.status.textContent = text;
  ui.status.classList.toggle("error", isError);
}

function setHover(text, data = {}) {
  ui.hover.textContent = text;
  for (const key of Object.keys(ui.hover.dataset)) delete ui.hover.dataset[key];
  Object.assign(ui.hover.dataset, data);
}

const HOVER_HINT = "Hover over a cell of the large map to see its weight.";

// ----- the page -------------------------------------------------------------------------------

/** Load the style sheet (same origin, as the page's CSP asks) and wait for it. */
function loadStyles() {
  const link = el("link", { rel: "stylesheet", href: new URL("./static/viewer.css", import.meta.url).href });
  const loaded = new Promise((resolve) => {
    link.addEventListener("load", resolve);
    link.addEventListener("error", resolve); // the page still works, only plainer
  });
  document.head.append(link);
  return loaded;
}

/** Build the controls bar: the run(s), the sentence, the step, the attention kind/layer/head, the
 * units, the order of the small maps, the zoom. */
function buildControls() {
  ui.run = select("run-select", (v) => {
    if (v === state.compare) state.compare = state.run; // the two runs swap places
    state.run = v;
    update();
  });
  ui.compare = select("compare-select", (v) => {
    state.compare = v;
    update();
  });
  ui.sentence = select("sentence-select", (v) => {
    state.tag = v;
    update();
  });
  ui.step = el("input", { id: "step-slider", type: "range", min: 0, max: 0, step: 1 });
  ui.step.addEventListener("input", () => {
    if (!state.steps.length) return; // nothing evaluated yet
    state.step = state.steps[Number(ui.step.value)].step;
    update();
  });
  ui.stepLabel = el("span", { id: "step-label", className: "value" });
  ui.play = el("button", { id: "play-button", type: "button", textContent: "▶ play" });
  ui.play.addEventListener("click", togglePlay);
  ui.kind = select("kind-select", (v) => {
    state.kind = v;
    update();
  });
  setOptions(ui.kind, Object.entries(KIND_NAMES), state.kind);
  ui.layer = select("layer-select", (v) => {
    state.layer = Number(v);
    update();
  });
  ui.head = select("head-select", (v) => {
    state.head = v;
    update();
  });
  ui.units = select("units-select", (v) => {
    state.units = v;
    update();
  });
  setOptions(ui.units, [["subwords", "subwords"], ["words", "words"]], state.units);
  ui.order = select("order-select", (v) => {
    state.order = v;
    update();
  });
  ui.zoom = el("input", { id: "zoom-slider", type: "range", min: MIN_CELL, max: MAX_CELL, step: 2, value: state.cell });
  ui.zoom.addEventListener("input", () => {
    state.cell = Number(ui.zoom.value);
    update();
  });
  ui.reload = el("button", { id: "reload-button", type: "button", textContent: "reload" });
  ui.reload.addEventListener("click", reload);

  return el(
    "div",
    { className: "controls" },
    labelled("Run", ui.run),
    labelled("Beside it", ui.compare),
    labelled("Sentence", ui.sentence),
    labelled("Step", el("span", { className: "inline" }, ui.step, ui.stepLabel, ui.play)),
    labelled("Attention", ui.kind),
    labelled("Layer", ui.layer),
    labelled("Head", ui.head),
    labelled("Tokens", ui.units),
    labelled("Small maps by", ui.order),
    labelled("Zoom", ui.zoom),
    ui.reload,
  );
}

/** Walk through the steps of training (from the first when at the last), or stop doing so. */
function togglePlay() {
  if (player !== null) {
    stopPlaying();
    return;
  }
  if (!state.steps.length) return; // nothing to play yet
  if (Number(ui.step.value) >= state.steps.length - 1) state.step = state.steps[0].step;
  ui.play.textContent = "■ stop";
  update();
  player = setInterval(() => {
    const next = Number(ui.step.value) + 1;
    if (next >= state.steps.length) {
      stopPlaying();
      return;
    }
    state.step = state.steps[next].step;
    update();
  }, PLAY_MS);
}

function stopPlaying() {
  clearInterval(player);
  player = null;
  ui.play.textContent = "▶ play";
}

/** Forget what was fetched and read the runs again (after training wrote more). */
async function reload() {
  // at the last step, follow training to its newest evaluation; a step chosen earlier stays
  const last = state.steps.length ? state.steps[state.steps.length - 1].step : null;
  if (state.step === last) state.step = null;
  cache.steps.clear();
  cache.samples.clear();
  await loadRuns();
}

/** Fetch the list of runs and show the first (or keep the runs already chosen). */
async function loadRuns() {
  try {
    state.runs = await fetchJson("runs");
  } catch (err) {
    setStatus(`Could not read the runs: ${err.message}`, true);
    return;
  }
  if (!state.runs.length) {
    setStatus("No attention samples yet: they are written at each evaluation of a run trained with trainer.attention_samples > 0.");
    return;
  }
  const names = state.runs.map((r) => r.run);
  if (!names.includes(state.run)) state.run = names[0];
  if (!names.includes(state.compare)) state.compare = "";
  setOptions(ui.run, names.map((n) => [n, n]), state.run);
  await update();
}

/** The TensorBoard entry point: build the page and show the first run. */
export async function render() {
  await loadStyles();
  document.title = "Attention";
  ui.status = el("div", { id: "status", className: "status" });
  ui.hover = el("div", { id: "hover-info", className: "hover-info", textContent: HOVER_HINT });
  ui.panels = el("div", { id: "panels", className: "panels" });
  document.body.append(
    el("div", { className: "top" }, buildControls(), ui.hover, ui.status),
    ui.panels,
  );
  await loadRuns();
}

// ----- one update: fetch what the choices need, then redraw -----------------------------------

/** Fetch the samples of the chosen run(s) and redraw every panel. */
async function update() {
  if (!state.runs.length) return; // "no attention samples yet" stays on the page
  const ticket = ++updates;
  setStatus("loading…");
  try {
    const panels = await loadPanels();
    if (ticket !== updates) return; // the user changed something meanwhile: a newer update draws
    syncControls(panels);
    ui.panels.replaceChildren(...panels.map(panelElement));
    ui.panels.classList.toggle("side-by-side", panels.length > 1);
    showOverlays();
    setHover(HOVER_HINT);
    setStatus("");
  } catch (err) {
    if (ticket === updates) setStatus(`Could not load the attention: ${err.message}`, true);
  }
}

/** The main run's panel data, and the second run's at the same (or the nearest) step. */
async function loadPanels() {
  const sentences = state.runs.find((r) => r.run === state.run).sentences;
  if (!sentences.includes(state.tag)) state.tag = sentences[0];
  const main = await loadPanel(state.run, state.step);
  state.steps = main.steps || [];
  state.step = main.step ?? null;
  const panels = [main];
  if (state.compare) panels.push(await loadPanel(state.compare, state.step));
  return panels;
}

/** {run, steps, step, sample} of `run` at the step nearest `wanted`, or {run, problem}. */
async function loadPanel(run, wanted) {
  const sentences = state.runs.find((r) => r.run === run).sentences;
  if (!sentences.includes(state.tag)) {
    return { run, problem: `This run has no attention sample ${state.tag}.` };
  }
  const steps = await getSteps(run, state.tag);
  if (!steps.length) return { run, problem: `This run has no steps for ${state.tag}.` };
  const step = nearestStep(steps, wanted);
  return { run, steps, step, sample: await getSample(run, state.tag, step) };
}

/** Make the controls show the current choices; the layer and head lists cover every shown run. */
function syncControls(panels) {
  const names = state.runs.map((r) => r.run);
  setOptions(ui.run, names.map((n) => [n, n]), state.run);
  setOptions(ui.compare, [["", "(none)"], ...names.filter((n) => n !== state.run).map((n) => [n, n])], state.compare);
  const sentences = state.runs.find((r) => r.run === state.run).sentences;
  setOptions(ui.sentence, sentences.map((t, i) => [t, `${i + 1}: ${t.split("/").pop()}`]), state.tag);

  const index = Math.max(0, state.steps.findIndex((s) => s.step === state.step));
  ui.step.max = Math.max(0, state.steps.length - 1);
  ui.step.value = index;
  ui.stepLabel.textContent = state.step === null ? "-" : `${state.step} (${index + 1}/${state.steps.length})`;

  const maps = panels.filter((p) => p.sample).flatMap((p) => p.sample.maps.filter((m) => m.kind === state.kind));
  const layers = Math.max(1, ...maps.map((m) => m.layer));
  state.layer = Math.min(state.layer, layers);
  setOptions(ui.layer, [...Array(layers).keys()].map((i) => [i + 1, `${i + 1}`]), state.layer);
  const heads = Math.max(1, ...maps.filter((m) => m.layer === state.layer).map((m) => m.heads));
  if (Number(state.head) > heads) state.head = "mean";
  const headOptions = [["mean", "mean of heads"], ["max", "max of heads"]];
  for (let h = 1; h <= heads; h++) headOptions.push([String(h), `head ${h}`]);
  setOptions(ui.head, headOptions, state.head);
  // by importance only where a shown sample measured it
  const measured = panels.some((p) => p.sample?.head_stats?.some((m) => m.some((h) => h.importance != null)));
  if (state.order === "importance" && !measured) state.order = "number";
  const orders = [["number", "head number"], ["entropy", "entropy (lowest first)"]];
  if (measured) orders.splice(1, 0, ["importance", "importance (highest first)"]);
  setOptions(ui.order, orders, state.order);
  ui.zoom.value = state.cell;
}

// ----- a panel: one run's texts, small maps and large map -------------------------------------

function panelElement(panel) {
  const section = el("section", { className: "panel", dataset: { run: panel.run } });
  const title = el("h2", {}, el("span", { className: "run-name", textContent: panel.run }));
  section.append(title);
  if (panel.problem) {
    section.append(el("p", { className: "missing", textContent: panel.problem }));
    return section;
  }
  const { sample, step } = panel;
  const nearest = step !== state.step ? ` (nearest to ${state.step})` : "";
  title.append(el("span", { className: "meta", textContent: `${sample.model} · step ${step}${nearest}` }));
  section.append(textsElement(sample), thumbnailsElement(sample));
  const matrix = shownMatrix(sample, state);
  if (matrix.missing) {
    section.append(el("p", { className: "missing", textContent: matrix.missing }));
  } else {
    section.append(largeMapElement(panel, matrix));
  }
  return section;
}

/** The source, reference and hypothesis as text. */
function textsElement(sample) {
  const rows = [
    ["source", sample.source],
    ["reference", sample.reference],
    ["hypothesis", sample.hypothesis],
  ];
  return el(
    "dl",
    { className: "texts" },
    ...rows.flatMap(([name, text]) => [el("dt", { textContent: name }), el("dd", { className: name, textContent: text })]),
  );
}

/** The choices of the large map in words, e.g. "cross attention (output -> source), layer 2, head 3". */
function describe(choice) {
  const head = choice.head === "mean" ? "mean of heads" : choice.head === "max" ? "max of heads" : `head ${choice.head}`;
  return `${KIND_NAMES[choice.kind]}, layer ${choice.layer}, ${head}, ${choice.units}`;
}

/**
 * Every layer x head of the chosen kind as a small map with the head's numbers under it (entropy,
 * importance), a layer's heads in the chosen order; a click picks that layer and head.
 */
function thumbnailsElement(sample) {
  const maps = sample.maps.filter((m) => m.kind === state.kind);
  const grid = el("div", { className: "thumbs" });
  if (maps.length) grid.append(numbersNote(sample));
  for (const map of maps) {
    const row = el("div", { className: "thumb-row" }, el("span", { className: "thumb-layer", textContent: `layer ${map.layer}` }));
    for (const numbers of orderHeads(headNumbers(sample, map), state.order)) {
      const h = numbers.head;
      const choice = { ...state, layer: map.layer, head: String(h) };
      const matrix = shownMatrix(sample, choice);
      // one canvas pixel per cell, stretched by CSS (without smoothing: see viewer.css)
      const canvas = el("canvas", { width: matrix.cols, height: matrix.rows });
      paintCells(canvas.getContext("2d"), matrix, 1);
      const scale = THUMB_SIZE / Math.max(matrix.rows, matrix.cols);
      canvas.style.width = `${matrix.cols * scale}px`;
      canvas.style.height = `${matrix.rows * scale}px`;
      const picked = map.layer === state.layer && (state.head === String(h) || state.head === "mean" || state.head === "max");
      const button = el(
        "button",
        { type: "button", className: picked ? "thumb picked" : "thumb", title: describe(choice), dataset: { layer: map.layer, head: h } },
        canvas,
        el("span", { className: "thumb-head", textContent: `head ${h}` }),
        el("span", { className: numbers.ofSentence ? "thumb-numbers of-sentence" : "thumb-numbers", textContent: numbersText(numbers) }),
      );
      button.addEventListener("click", () => {
        state.layer = map.layer;
        state.head = String(h);
        update();
      });
      row.append(button);
    }
    grid.append(row);
  }
  return grid;
}

/** What the numbers under the small maps are, and where they come from. */
function numbersNote(sample) {
  const text = sample.head_stats
    ? "Under each head, over a validation set: H = mean entropy of its rows (nats), Δ = rise of the validation loss when it alone is masked."
    : "Under each head: H = mean entropy of its rows (nats) in this sentence's map (this sample has no validation statistics).";
  return el("p", { className: "thumbs-note", textContent: text });
}

/**
 * The large map: a canvas of cells with the row tokens on its left and the column tokens above
 * it as HTML text (sticky, so they stay in view while the map scrolls); hovering a cell outlines
 * its row and column and shows the two tokens and the weight in the hover line.
 */
function largeMapElement(panel, matrix) {
  const cell = state.cell;
  const [canvas, ctx] = sizedCanvas(matrix.cols * cell, matrix.rows * cell);
  canvas.className = "map";
  const draw = () => paintCells(ctx, matrix, cell);
  draw();

  const colLabels = matrix.colLabels.map((t) => el("span", { className: "col-label", textContent: t, style: { width: `${cell}px` } }));
  const rowLabels = matrix.rowLabels.map((t) => el("span", { className: "row-label", textContent: t, style: { height: `${cell}px`, lineHeight: `${cell}px` } }));
  const marks = state.kind === "cross" ? alignmentMarks(panel.sample, matrix) : [];
  const cells = el("div", { className: "map-cells" }, canvas);
  if (marks.length) cells.append(overlayElement(marks, matrix, cell));
  const grid = el(
    "div",
    { className: "map-grid" },
    el("div", { className: "corner" }),
    el("div", { className: "col-labels" }, ...colLabels),
    el("div", { className: "row-labels" }, ...rowLabels),
    cells,
  );

  let hovered = null; // [row, col] outlined now
  const clear = () => {
    if (hovered === null) return;
    rowLabels[hovered[0]].classList.remove("hot");
    colLabels[hovered[1]].classList.remove("hot");
    hovered = null;
    draw();
  };
  canvas.addEventListener("mousemove", (event) => {
    const box = canvas.getBoundingClientRect();
    const r = Math.floor((event.clientY - box.top) / cell);
    const c = Math.floor((event.clientX - box.left) / cell);
    if (r < 0 || c < 0 || r >= matrix.rows || c >= matrix.cols) return;
    if (hovered && hovered[0] === r && hovered[1] === c) return;
    clear();
    hovered = [r, c];
    outlineCross(ctx, matrix, cell, r, c);
    rowLabels[r].classList.add("hot");
    colLabels[c].classList.add("hot");
    const weight = matrix.values[r * matrix.cols + c];
    const linked = marksAt(shownMarks(marks), r, c).map((m) => (m.type === "link" ? "model link" : `gold ${m.type}`));
    const also = linked.length ? ` (${linked.join(", ")})` : "";
    setHover(`${panel.run}: ${matrix.rowLabels[r]} → ${matrix.colLabels[c]}${also}: ${weight.toFixed(3)}`, {
      run: panel.run,
      row: r,
      col: c,
      weight: weight.toFixed(3),
    });
  });
  canvas.addEventListener("mouseleave", () => {
    clear();
    setHover(HOVER_HINT);
  });

  const link = el("a", { className: "download", hidden: true });
  const button = el("button", { type: "button", className: "export", textContent: "export PNG" });
  button.addEventListener("click", () => exportPng(panel, matrix, shownMarks(marks), link));
  const large = el(
    "div",
    { className: "large" },
    el("div", { className: "map-title" }, el("span", { textContent: describe(state) }), button, link),
  );
  if (state.kind === "cross") large.append(...overlayBar(panel.sample, marks));
  large.append(el("div", { className: "map-scroll" }, grid));
  return large;
}

/** The marks the toggles show now. */
function shownMarks(marks) {
  return marks.filter((m) => (m.type === "link" ? state.links : state.gold));
}

/** An SVG over the map's canvas with a box per gold link and a dot per model link (viewer.css
 * hides either kind when its toggle is off). */
function overlayElement(marks, matrix, cell) {
  const layer = svg("svg", { class: "overlay", width: matrix.cols * cell, height: matrix.rows * cell });
  for (const mark of marks) {
    const data = { "data-src": mark.link[0], "data-out": mark.link[1] };
    if (mark.type === "link") {
      layer.append(svg("circle", { class: "model-link", ...linkDot(mark, cell), fill: LINK_COLOUR, stroke: "#ffffff", "stroke-width": 1.5, ...data }));
      continue;
    }
    const style = MARK_STYLE[mark.type];
    const box = markBox(mark, cell);
    const rect = (colour, width) => svg("rect", { ...box, fill: "none", stroke: colour, "stroke-width": width, "stroke-dasharray": style.dash.join(" ") || "none" });
    layer.append(svg("g", { class: `gold-box ${mark.type}`, ...data }, rect("#ffffff", style.halo), rect("#000000", style.line)));
  }
  return layer;
}

/**
 * The line above a cross map with a gold alignment or model links: a toggle for each that the
 * sample has, and a legend with their counts. Nothing when it has neither.
 */
function overlayBar(sample, marks) {
  const count = (type) => marks.filter((m) => m.type === type).length;
  const items = [];
  if (sample.gold) {
    items.push(
      toggle("gold-toggle", "gold", sample.gold_label || "gold alignment"),
      legendItem("sure", `sure (${count("sure")})`),
      legendItem("possible", `possible (${count("possible")})`),
    );
  }
  if (sample.links) {
    const method = sample.links_method ? ` (${sample.links_method})` : "";
    items.push(toggle("links-toggle", "links", "model links"), legendItem("link", `${count("link")} links${method}`));
  }
  return items.length ? [el("div", { className: "overlay-bar" }, ...items)] : [];
}

/** A checkbox that shows or hides one kind of mark on every panel (`state[key]`). */
function toggle(className, key, text) {
  const box = el("input", { type: "checkbox", className, checked: state[key] });
  box.addEventListener("change", () => {
    state[key] = box.checked;
    showOverlays();
  });
  return el("label", { className: "overlay-toggle" }, box, text);
}

/** A small drawing of a mark of `type` as on the map (a box over a word of two pieces) and its text. */
function legendItem(type, text) {
  const cell = 18;
  const cols = type === "link" ? 1 : 2;
  const mark = { type, link: [0, 0], top: 0, bottom: 1, left: 0, right: cols };
  const swatch = overlayElement([mark], { rows: 1, cols }, cell);
  swatch.setAttribute("class", "legend-swatch");
  return el("span", { className: `legend-item legend-${type}` }, swatch, text);
}

/** Show or hide the marks of every panel as the toggles say, and make every toggle say so. */
function showOverlays() {
  ui.panels.classList.toggle("hide-gold", !state.gold);
  ui.panels.classList.toggle("hide-links", !state.links);
  for (const box of ui.panels.querySelectorAll("input.gold-toggle")) box.checked = state.gold;
  for (const box of ui.panels.querySelectorAll("input.links-toggle")) box.checked = state.links;
}

// ----- export ---------------------------------------------------------------------------------

const EXPORT_FONT = "12px sans-serif";

/**
 * The large map as a PNG file with its labels and the shown `marks` (gold boxes, model links):
 * drawn again on a canvas of its own (the HTML labels and the SVG overlay are not part of the
 * map's canvas), then offered as a download through `link`.
 */
function exportPng(panel, matrix, marks, link) {
  const cell = state.cell;
  const pad = 8;
  const measure = document.createElement("canvas").getContext("2d");
  measure.font = EXPORT_FONT;
  const widest = (labels) => Math.max(0, ...labels.map((t) => measure.measureText(t).width));
  const left = Math.ceil(widest(matrix.rowLabels)) + 2 * pad; // room for the row tokens
  const top = 24 + Math.ceil(widest(matrix.colLabels)) + 2 * pad; // a title line, then the column tokens
  const keys = [];
  if (marks.some((m) => m.type !== "link")) keys.push("gold: solid sure, dashed possible");
  if (marks.some((m) => m.type === "link")) keys.push("dots: model links");
  const title = `${panel.run}, step ${panel.step}: ${describe(state)}${keys.length ? ` (${keys.join("; ")})` : ""}`;
  const width = Math.max(left + matrix.cols * cell + pad, Math.ceil(measure.measureText(title).width) + 2 * pad, 480);
  const height = top + matrix.rows * cell + pad;

  const canvas = document.createElement("canvas");
  canvas.width = width;
  canvas.height = height;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#ffffff";
  ctx.fillRect(0, 0, width, height);
  ctx.fillStyle = "#000000";
  ctx.font = EXPORT_FONT;
  ctx.textBaseline = "top";
  ctx.fillText(title, pad, pad);
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  matrix.rowLabels.forEach((t, r) => ctx.fillText(t, left - pad, top + r * cell + cell / 2));
  ctx.textAlign = "left";
  matrix.colLabels.forEach((t, c) => {
    ctx.save();
    ctx.translate(left + c * cell + cell / 2, top - pad);
    ctx.rotate(-Math.PI / 2); // read from bottom to top, ending just above the column
    ctx.fillText(t, 0, 0);
    ctx.restore();
  });
  paintCells(ctx, matrix, cell, left, top);
  paintMarks(ctx, marks, cell, left, top);

  canvas.toBlob((blob) => {
    if (blob === null) {
      setStatus("This map is too large for a PNG at this zoom: zoom out and export again.", true);
      return;
    }
    if (link.href) URL.revokeObjectURL(link.href);
    link.href = URL.createObjectURL(blob);
    link.download = `attention_${panel.run}_step${panel.step}_${state.kind}_layer${state.layer}_${state.head}.png`.replace(/[^\w.-]+/g, "_");
    link.textContent = link.download;
    link.hidden = false;
    link.click();
  }, "image/png");
}
