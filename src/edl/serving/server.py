"""``edl serve``: an exported model's ONNX file served by ONNX Runtime over the Open Inference Protocol.

The server is KServe's own model server (``kserve.ModelServer``: its REST routes, error
codes and metrics, the ones a KServe InferenceService answers with), with one model whose
``predict`` runs an ``onnxruntime.InferenceSession``. ONNX Runtime rather than Paddle: a
much smaller runtime, and the same file that Triton or KServe's ONNX runtime load.

Routes (KServe v2 REST): ``GET /v2/health/ready``, ``GET /v2/models/{name}`` (metadata:
the input and output tensors), ``GET /v2/models/{name}/ready``, ``POST
/v2/models/{name}/infer``; also KServe's v1 ``POST /v1/models/{name}:predict`` with
``{"instances": [...]}``. A request that does not fit the model's input (name, datatype,
shape) is answered 400 with one line saying why; an unknown model 404.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import uuid
import warnings

import numpy as np
import onnxruntime as ort

# kserve parses sys.argv when its model server module is imported (``parse_known_args()`` at module
# level, for its own flags); edl's flags are not its flags, so it sees none.
_argv, sys.argv = sys.argv, sys.argv[:1]
try:
    import kserve
    from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
    from kserve.errors import InvalidInput, ModelNotFound
    from kserve.protocol.rest.server import RESTServer
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
    from kserve.utils.numpy_codec import to_np_dtype
finally:
    sys.argv = _argv

from edl.errors import EdlError, UserError  # noqa: E402
from edl.serving.signature import RequestTensor, TensorSpec, request_problem  # noqa: E402
from edl.storage.checkpoint import ONNX_FILE  # noqa: E402
from edl.storage.store import open_store  # noqa: E402

log = logging.getLogger("edl.serving")

DEFAULT_NAME = "model"  # as KServe's model server names a model by default (its --model_name)


class _ClientErrorsInOneLine(logging.Filter):
    """kserve logs every 400 and 404 with a traceback; a client's bad request is one line of the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (InvalidInput, ModelNotFound)):
            record.msg, record.args, record.exc_info, record.exc_text = f"request refused: {exc}", None, None, None
        return True


def _quiet_kserve() -> None:
    logging.getLogger("kserve").addFilter(_ClientErrorsInOneLine())
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)  # two timing lines per request
    # kserve 0.21 answers with FastAPI's ORJSONResponse, which FastAPI 0.165 deprecates (a warning per request)
    warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated")


def onnx_file(files: list[str], name: str) -> str | None:
    """Which of a model directory's ``files`` to serve as ``name``: its ``model.onnx``, or in a model
    repository (``NAME/VERSION/model.onnx``, as Triton and the pipeline's deploy step lay it out) the highest
    version of ``name``; ``None`` when there is neither."""
    if ONNX_FILE in files:
        return ONNX_FILE
    versions = [int(m["version"]) for f in files if (m := _REPOSITORY_ENTRY.fullmatch(f)) and m["name"] == name]
    return f"{name}/{max(versions)}/{ONNX_FILE}" if versions else None


_REPOSITORY_ENTRY = re.compile(rf"(?P<name>[^/]+)/(?P<version>[0-9]+)/{re.escape(ONNX_FILE)}")


def read_onnx(model_uri: str, name: str = DEFAULT_NAME) -> bytes:
    """The ONNX model to serve as ``name`` from ``MODEL_URI`` (a ``file://``, path or ``s3://`` model directory
    or model repository: ``onnx_file``)."""
    store = open_store(model_uri, "MODEL_URI")
    try:
        path = onnx_file(store.list(""), name)
        if path is None:
            raise UserError(f"MODEL_URI {model_uri}: no {ONNX_FILE} there, nor {name}/VERSION/{ONNX_FILE} (edl train "
                            f"writes it into CHECKPOINT_URI/model; a model the converter cannot take has none, see "
                            f"its log)")
        return store.get(path)
    except EdlError:
        raise
    except OSError as e:
        raise UserError(f"MODEL_URI {model_uri}: cannot read {ONNX_FILE}: {e}") from None


class OnnxModel(kserve.Model):
    """One ONNX model, named ``name`` on the server's routes."""

    def __init__(self, name: str, onnx_model: bytes) -> None:
        super().__init__(name)
        self._onnx = onnx_model
        self.load()

    def load(self) -> bool:
        try:
            self.session = ort.InferenceSession(self._onnx, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own (pybind) exception types
            raise UserError(f"{ONNX_FILE} is not a model ONNX Runtime can load: {str(e).splitlines()[0]}") from None
        self.inputs = [TensorSpec.of_onnx(i.name, i.type, i.shape) for i in self.session.get_inputs()]
        self.outputs = [TensorSpec.of_onnx(o.name, o.type, o.shape) for o in self.session.get_outputs()]
        self.ready = True
        return self.ready

    def get_input_types(self) -> list[dict]:
        return [s.to_json() for s in self.inputs]

    def get_output_types(self) -> list[dict]:
        return [s.to_json() for s in self.outputs]

    def predict(self, payload: InferRequest | dict, headers: dict | None = None,
                response_headers: dict | None = None) -> InferResponse | dict:
        if isinstance(payload, dict):  # v1: {"instances": [...]} for a model of one input
            return self._predict_v1(payload)
        problem = request_problem(self.inputs, [RequestTensor(i.name, i.datatype, tuple(i.shape))
                                                for i in payload.inputs])
        if problem is not None:
            raise InvalidInput(problem)
        feeds = {}
        for given in payload.inputs:
            try:
                feeds[given.name] = given.as_numpy()
            except (ValueError, TypeError):
                raise InvalidInput(f"input {given.name!r}: its data does not fill shape {list(given.shape)}") from None
        results = self.session.run([o.name for o in self.outputs], feeds)
        outputs = []
        for spec, value in zip(self.outputs, results):
            out = InferOutput(spec.name, list(value.shape), spec.datatype)
            out.set_data_from_numpy(value, binary_data=False)
            outputs.append(out)
        return InferResponse(response_id=payload.id or str(uuid.uuid4()), model_name=self.name,
                             infer_outputs=outputs)

    def _predict_v1(self, payload: dict) -> dict:
        if len(self.inputs) != 1 or not isinstance(payload.get("instances"), list):
            raise InvalidInput('a v1 request is {"instances": [...]}, for a model of one input')
        spec = self.inputs[0]
        try:
            x = np.asarray(payload["instances"], dtype=spec_dtype(spec))
        except (ValueError, TypeError):
            raise InvalidInput("instances: not a rectangular array of numbers") from None
        problem = request_problem(self.inputs, [RequestTensor(spec.name, spec.datatype, x.shape)])
        if problem is not None:
            raise InvalidInput(problem)
        return {"predictions": self.session.run([self.outputs[0].name], {spec.name: x})[0].tolist()}


def spec_dtype(spec: TensorSpec) -> np.dtype:
    return np.dtype(to_np_dtype(spec.datatype))


class _BoundModelServer(kserve.ModelServer):
    """KServe's model server, its one REST server bound to ``host`` (KServe's own binds every address): where
    pods share one network, as on edl's test plane, each predictor listens on its own pod's address."""

    def __init__(self, host: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.host = host

    def start(self, models: list) -> None:  # kserve.ModelServer.start, for one worker and no gRPC
        self._register_and_check_atleast_one_model_is_ready(models)
        self._rest_server = RESTServer(
            FASTAPI_APP_IMPORT_STRING, self.dataplane, self.model_repository_extension, self.http_port,
            access_log_format=self.access_log_format, workers=1, grace_period=self.grace_period,
            event_loop=self.event_loop, timeout_keep_alive=self.timeout_keep_alive)
        self._rest_server.config.host = self.host  # read when the server binds, in its start-up
        self.servers.append(self._rest_server.start())
        self.setup_event_loop()
        self.register_signal_handler()
        asyncio.run(self._serve())


def serve(model_uri: str, port: int, name: str = DEFAULT_NAME, host: str = "0.0.0.0") -> int:
    """Serve until SIGINT or SIGTERM (KServe's server stops gracefully on either); answers 0."""
    model = OnnxModel(name, read_onnx(model_uri, name))
    inputs = ", ".join(s.describe() for s in model.inputs)
    shown = "127.0.0.1" if host == "0.0.0.0" else host
    print(f"edl serve: {model_uri} as {name!r} (input {inputs}) on http://{shown}:{port}/v2/models/{name} "
          "(Open Inference Protocol; Ctrl-C stops)", flush=True)
    kwargs = dict(http_port=port, enable_grpc=False, workers=1, enable_docs_url=False, enable_latency_logging=False)
    server = kserve.ModelServer(**kwargs) if host == "0.0.0.0" else _BoundModelServer(host, **kwargs)
    _quiet_kserve()
    server.start([model])
    return 0
