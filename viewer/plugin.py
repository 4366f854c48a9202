"""The TensorBoard plugin of the attention viewer: the "Attention" tab and its data routes.

It reads the summaries training writes (``viewer/format.py``) through TensorBoard's data provider
only, so it works with the default fast loader (the ``tensorboard-data-server`` binary) and with
``--load_fast=false`` alike. Routes, under ``/data/plugin/nmt_attention/``:

    index.js                    the tab's ES module (``viewer/static/index.js``)
    static/<name>               another file of ``viewer/static/`` (a plain name in it, nothing else)
    runs                        [{"run", "sentences": [tag, ...]}], runs and tags sorted
    steps?run=R&tag=T           [{"step", "wall_time"}] of every evaluation, by step
    attention?run=R&tag=T[&step=S]
                                the stored header of that step (the last one without ``step``)
                                with "weights": the base64 of the uint8 weights

A bad or missing parameter answers 400, an unknown run, tag, step or file 404, each with a JSON
body ``{"error": "..."}``.

TensorBoard finds the plugin through the ``tensorboard_plugins`` entry point (pyproject.toml),
which names ``AttentionLoader``: it makes TensorBoard keep every evaluation of these summaries
(``--samples_per_plugin nmt_attention=0``) unless the command line says otherwise.
"""

import base64
import functools
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from viewer.format import PLUGIN_NAME, decode

STATIC = Path(__file__).resolve().parent / "static"
CONTENT_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".svg": "image/svg+xml",
}
ALL_STEPS = 1_000_000  # asked of the data provider: more evaluations than any run has


def static_file(name: str) -> Path:
    """The file ``name`` of the static folder: a plain file name listed there, nothing else (no
    folders, no ``..``, no absolute paths), else NotFoundError."""
    if name in {p.name for p in STATIC.iterdir() if p.is_file() and not p.name.startswith(".")}:
        return STATIC / name
    raise errors.NotFoundError(f"no static file {name!r}")


def json_errors(handler: Callable[..., wrappers.Response]) -> Callable:
    """A route as a WSGI app whose ``PublicError`` (bad parameter: 400, unknown entity: 404) answers
    ``{"error": message}`` with that status."""

    @functools.wraps(handler)
    @wrappers.Request.application
    def app(self, request: wrappers.Request) -> wrappers.Response:
        try:
            return handler(self, request)
        except errors.PublicError as e:
            return http_util.Respond(request, {"error": str(e)}, "application/json", code=e.http_code)

    return app


def required(request: wrappers.Request, name: str) -> str:
    value = request.args.get(name)
    if not value:
        raise errors.InvalidArgumentError(f"missing query parameter {name!r}")
    return value


def at_step(series: List[provider.BlobSequenceDatum], step: Optional[str]) -> provider.BlobSequenceDatum:
    """The datum of ``step`` (a query's text) in a series sorted by step; the last one when ``step`` is None."""
    if step is None:
        return series[-1]
    if not (step.isascii() and step.isdigit()):
        raise errors.InvalidArgumentError(f"step {step!r} is not a step number")
    found = [d for d in series if d.step == int(step)]
    if not found:
        raise errors.NotFoundError(f"no step {step} in this run and tag")
    return found[-1]


def sentence_number(tag: str) -> Tuple[str, int, str]:
    """The sort key of a tag ``nmt_attention/<name><i>`` (``sent<i>``: training's validation
    sentences; ``gold<i>``: ``scripts/align.py``'s gold pairs): the name, then ``i``, so that sent10
    comes after sent9 and each kind of sentence stays together."""
    name = tag.rstrip("0123456789")
    digits = tag[len(name) :]
    return (name, int(digits) if digits else -1, tag)


class AttentionPlugin(base_plugin.TBPlugin):
    """Serves the attention maps of the validation samples (every model, layer and head)."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        self._data = context.data_provider

    def get_plugin_apps(self) -> Dict[str, Callable]:
        return {
            "/index.js": self._index_js,
            "/static/*": self._static,
            "/runs": self._runs,
            "/steps": self._steps,
            "/attention": self._attention,
        }

    def is_active(self) -> bool:
        return False  # TensorBoard's core marks the tab active from the summaries' plugin name

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Attention")

    # ----- static files -----
    @json_errors
    def _index_js(self, request: wrappers.Request) -> wrappers.Response:
        return self._file(request, "index.js")

    @json_errors
    def _static(self, request: wrappers.Request) -> wrappers.Response:
        return self._file(request, request.path.split("/static/", 1)[1])

    def _file(self, request: wrappers.Request, name: str) -> wrappers.Response:
        path = static_file(name)
        content_type = CONTENT_TYPES.get(path.suffix, "application/octet-stream")
        return http_util.Respond(request, path.read_bytes(), content_type)

    # ----- data -----
    @json_errors
    def _runs(self, request: wrappers.Request) -> wrappers.Response:
        ctx, eid = plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)
        series = self._data.list_blob_sequences(ctx, experiment_id=eid, plugin_name=PLUGIN_NAME)
        runs = [
            {"run": run, "sentences": sorted(tags, key=sentence_number)}
            for run, tags in sorted(series.items())
        ]
        return http_util.Respond(request, runs, "application/json")

    @json_errors
    def _steps(self, request: wrappers.Request) -> wrappers.Response:
        steps = [{"step": d.step, "wall_time": d.wall_time} for d in self._series(request)]
        return http_util.Respond(request, steps, "application/json")

    @json_errors
    def _attention(self, request: wrappers.Request) -> wrappers.Response:
        datum = at_step(self._series(request), request.args.get("step"))
        return http_util.Respond(request, self._read(request, datum), "application/json")

    def _series(self, request: wrappers.Request) -> List[provider.BlobSequenceDatum]:
        """Every stored evaluation of the query's run and tag, by step (NotFoundError if none)."""
        run, tag = required(request, "run"), required(request, "tag")
        ctx, eid = plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)
        found = self._data.read_blob_sequences(
            ctx,
            experiment_id=eid,
            plugin_name=PLUGIN_NAME,
            downsample=ALL_STEPS,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]),
        )
        series = found.get(run, {}).get(tag)
        if not series:
            raise errors.NotFoundError(f"no attention summaries for run {run!r} and tag {tag!r}")
        return sorted(series, key=lambda d: d.step)

    def _read(self, request: wrappers.Request, datum: provider.BlobSequenceDatum) -> Dict[str, Any]:
        """The header of one stored sentence plus its weights in base64."""
        ctx = plugin_util.context(request.environ)
        if len(datum.values) != 2:
            raise errors.InvalidArgumentError(
                f"step {datum.step}: {len(datum.values)} blobs, not a header and weights"
            )
        header_blob, weights = (self._data.read_blob(ctx, blob_key=ref.blob_key) for ref in datum.values)
        try:
            header = decode(header_blob, weights)
        except (ValueError, KeyError, TypeError) as error:  # another format version, or a damaged summary
            raise errors.InvalidArgumentError(f"step {datum.step}: {error}") from None
        return dict(header, weights=base64.b64encode(weights).decode("ascii"))


class AttentionLoader(base_plugin.TBLoader):
    """Loads the plugin and makes TensorBoard keep every step of its summaries.

    TensorBoard samples each tag's steps (10 by default for plugins it does not know, with the
    Python loader); ``--samples_per_plugin nmt_attention=0`` keeps all, and is the default here.
    A value given on the command line stays.
    """

    def fix_flags(self, flags: Any) -> None:
        samples = getattr(flags, "samples_per_plugin", None)
        if isinstance(samples, dict):
            samples.setdefault(PLUGIN_NAME, 0)

    def load(self, context: base_plugin.TBContext) -> AttentionPlugin:
        return AttentionPlugin(context)
