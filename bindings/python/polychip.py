"""polychip from Python, over ctypes and libpolychip.so (include/polychip/polychip.h).

    import polychip
    m = polychip.Model("m.gguf", device="cpu:0")
    for piece in m.generate("Hi", max_tokens=16, temperature=0):
        print(piece, end="", flush=True)

Nothing beyond the standard library. The library is found through $POLYCHIP_PREFIX
(<prefix>/lib/libpolychip.so.1), else relative to this file as `cmake --install` lays it out
(<prefix>/lib/python3/dist-packages/polychip.py beside <prefix>/lib/libpolychip.so.1), else
by the dynamic loader's own search. Generations may run from several threads at once; the
engine batches them.
"""

import ctypes
import json
import os
import queue
import threading

API_MAJOR = 1

_here = os.path.dirname(os.path.abspath(__file__))


class Error(RuntimeError):
    """A polychip error: `code` is the canonical code name, the message the CLI's."""

    CODES = ["OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED",
             "UNAVAILABLE", "FAILED_PRECONDITION", "CANCELLED", "INTERNAL"]

    def __init__(self, code, message):
        self.code = self.CODES[code] if 0 <= code < len(self.CODES) else str(code)
        super().__init__(message)


# ---- the C declarations (polychip.h, API 1.0) ------------------------------------------------

class _Param(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class _ModelParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_char_p),
                ("config_path", ctypes.c_char_p), ("params", ctypes.POINTER(_Param)),
                ("n_params", ctypes.c_size_t)]


class _Sampling(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("temperature", ctypes.c_float),
                ("top_k", ctypes.c_int32), ("top_p", ctypes.c_float), ("min_p", ctypes.c_float),
                ("repetition_penalty", ctypes.c_float), ("frequency_penalty", ctypes.c_float),
                ("presence_penalty", ctypes.c_float), ("seed", ctypes.c_int64),
                ("max_tokens", ctypes.c_int32), ("ignore_eos", ctypes.c_int32),
                ("stop", ctypes.POINTER(ctypes.c_char_p)), ("n_stop", ctypes.c_size_t)]


_TokenCallback = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32,
                                  ctypes.POINTER(ctypes.c_char), ctypes.c_size_t)


class _Request(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("prompt", ctypes.c_char_p),
                ("prompt_len", ctypes.c_size_t),
                ("prompt_tokens", ctypes.POINTER(ctypes.c_int32)),
                ("n_prompt_tokens", ctypes.c_size_t), ("sampling", ctypes.POINTER(_Sampling)),
                ("on_token", _TokenCallback), ("user_data", ctypes.c_void_p),
                ("priority", ctypes.c_int32), ("lora", ctypes.c_char_p),
                ("lora_scale", ctypes.c_float)]


class _Result(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("finish", ctypes.c_int),
                ("prompt_tokens", ctypes.c_int32), ("completion_tokens", ctypes.c_int32),
                ("cached_tokens", ctypes.c_int32)]


FINISH_REASONS = ["stop", "length", "cancelled"]
LIST_DISCOVER = 1
LIST_JSON = 2


def _library_candidates():
    name = "libpolychip.so.%d" % API_MAJOR
    prefix = os.environ.get("POLYCHIP_PREFIX")
    if prefix:
        yield os.path.join(prefix, "lib", name)
    yield os.path.join(_here, "..", "..", name)  # <prefix>/lib/python3/dist-packages
    yield os.path.join(_here, name)
    yield name  # LD_LIBRARY_PATH, the loader cache


def _load_library():
    tried = []
    for path in _library_candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + ": no such file")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(str(e))
    raise ImportError("libpolychip not found (set POLYCHIP_PREFIX); tried:\n  " +
                      "\n  ".join(tried))


_lib = _load_library()
_Err = ctypes.c_void_p  # polychip_error_t*


def _declare(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_declare("polychip_api_version", None, ctypes.POINTER(ctypes.c_uint32),
         ctypes.POINTER(ctypes.c_uint32))
_declare("polychip_error_code", ctypes.c_int, _Err)
_declare("polychip_error_message", ctypes.c_char_p, _Err)
_declare("polychip_error_free", None, _Err)
_declare("polychip_string_free", None, ctypes.c_void_p)
_declare("polychip_register_backend_path", _Err, ctypes.c_char_p, ctypes.POINTER(_Param),
         ctypes.c_size_t)
_declare("polychip_register_comm_path", _Err, ctypes.c_char_p, ctypes.POINTER(_Param),
         ctypes.c_size_t)
_declare("polychip_list_plugins", _Err, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p))
_declare("polychip_model_params_init", None, ctypes.POINTER(_ModelParams))
_declare("polychip_model_load", _Err, ctypes.c_char_p, ctypes.POINTER(_ModelParams),
         ctypes.POINTER(ctypes.c_void_p))
_declare("polychip_model_free", None, ctypes.c_void_p)
_declare("polychip_model_vocab_size", ctypes.c_int32, ctypes.c_void_p)
_declare("polychip_model_context_length", ctypes.c_int64, ctypes.c_void_p)
_declare("polychip_model_describe", ctypes.c_char_p, ctypes.c_void_p)
_declare("polychip_tokenize", _Err, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
         ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
         ctypes.POINTER(ctypes.c_size_t))
_declare("polychip_detokenize", _Err, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
         ctypes.c_size_t, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t,
         ctypes.POINTER(ctypes.c_size_t))
_declare("polychip_sampling_init", None, ctypes.POINTER(_Sampling))
_declare("polychip_request_init", None, ctypes.POINTER(_Request))
_declare("polychip_generate", _Err, ctypes.c_void_p, ctypes.POINTER(_Request),
         ctypes.POINTER(_Result))


def _check(err):
    if err:
        code = _lib.polychip_error_code(err)
        message = _lib.polychip_error_message(err).decode("utf-8", "replace")
        _lib.polychip_error_free(err)
        raise Error(code, message)


def _params(mapping):
    # A list or tuple value repeats its key (lora=["a=a.gguf", "b=b.gguf"]).
    items = [(str(k).encode(), str(v).encode())
             for k, vs in (mapping or {}).items()
             for v in (vs if isinstance(vs, (list, tuple)) else [vs])]
    array = (_Param * max(len(items), 1))(*[_Param(k, v) for k, v in items])
    return array, len(items)


def api_version():
    major, minor = ctypes.c_uint32(), ctypes.c_uint32()
    _lib.polychip_api_version(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def register_backend(path, **params):
    """Loads a device plugin file (libpolychip_backend_<name>.so) with its parameters."""
    array, n = _params(params)
    _check(_lib.polychip_register_backend_path(os.fsencode(path), array, n))


def register_comm(path, **params):
    array, n = _params(params)
    _check(_lib.polychip_register_comm_path(os.fsencode(path), array, n))


def list_plugins(discover=False):
    """The plugins and devices, as `polychip devices --json` lists them (a dict)."""
    text = ctypes.c_void_p()
    _check(_lib.polychip_list_plugins(LIST_JSON | (LIST_DISCOVER if discover else 0),
                                      ctypes.byref(text)))
    try:
        return json.loads(ctypes.string_at(text).decode("utf-8"))
    finally:
        _lib.polychip_string_free(text)


class Model:
    """A GGUF model loaded on a device, with its engine running.

    device: "cpu:0" as `--device` (None: the environment, config or best plugin); config: a
    YAML runtime config path; further keyword arguments are the model parameters of
    polychip_model_load (threads, context_length, max_total_tokens, kv_cache_dtype, ...;
    lora="NAME=PATH[:SCALE]" or a list of them, which generate(lora=NAME) then applies).
    """

    def __init__(self, path, device=None, config=None, **params):
        self._handle = None  # close() and __del__ work even when the load fails
        mp = _ModelParams()
        _lib.polychip_model_params_init(ctypes.byref(mp))
        mp.device = device.encode() if device else None
        mp.config_path = os.fsencode(config) if config else None
        self._param_array, mp.n_params = _params(params)
        mp.params = self._param_array
        handle = ctypes.c_void_p()
        _check(_lib.polychip_model_load(os.fsencode(path), ctypes.byref(mp),
                                        ctypes.byref(handle)))
        self._handle = handle

    def close(self):
        if self._handle:
            _lib.polychip_model_free(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    @property
    def vocab_size(self):
        return _lib.polychip_model_vocab_size(self._handle)

    @property
    def context_length(self):
        return _lib.polychip_model_context_length(self._handle)

    def __repr__(self):
        return "polychip.Model(%s)" % _lib.polychip_model_describe(self._handle).decode()

    def tokenize(self, text, add_special=True, parse_special=True):
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            out = (ctypes.c_int32 * capacity)()
            n = ctypes.c_size_t()
            err = _lib.polychip_tokenize(self._handle, data, len(data), int(add_special),
                                         int(parse_special), out, capacity, ctypes.byref(n))
            if err and _lib.polychip_error_code(err) == 3 and n.value > capacity:
                _lib.polychip_error_free(err)
                capacity = n.value
                continue
            _check(err)
            return list(out[:n.value])

    def detokenize(self, tokens, render_special=False):
        ids = (ctypes.c_int32 * max(len(tokens), 1))(*tokens)
        capacity = 16 * len(tokens) + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            n = ctypes.c_size_t()
            err = _lib.polychip_detokenize(self._handle, ids, len(tokens), int(render_special),
                                           buf, capacity, ctypes.byref(n))
            if err and _lib.polychip_error_code(err) == 3 and n.value > capacity:
                _lib.polychip_error_free(err)
                capacity = n.value
                continue
            _check(err)
            return buf.raw[:n.value].decode("utf-8", "replace")

    def generate(self, prompt, max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                 repetition_penalty=1.0, seed=-1, stop=(), ignore_eos=False, tokens=False,
                 lora=None, lora_scale=0.0):
        """Yields the generated text piece by piece (with tokens=True: (token id, piece)
        pairs; the text left at the end comes as token -1). Leaving the loop early cancels the
        generation. `prompt` is text or a list of token ids; `lora` names an adapter loaded
        with the model (None: the base), at `lora_scale` (0: the adapter's own scale)."""
        sampling = _Sampling()
        _lib.polychip_sampling_init(ctypes.byref(sampling))
        sampling.max_tokens = max_tokens
        sampling.temperature = temperature
        sampling.top_k = top_k
        sampling.top_p = top_p
        sampling.min_p = min_p
        sampling.repetition_penalty = repetition_penalty
        sampling.seed = seed
        sampling.ignore_eos = int(ignore_eos)
        stops = (ctypes.c_char_p * max(len(stop), 1))(*[s.encode() for s in stop])
        sampling.stop = stops
        sampling.n_stop = len(stop)

        request = _Request()
        _lib.polychip_request_init(ctypes.byref(request))
        if isinstance(prompt, str):
            data = prompt.encode("utf-8")
            request.prompt = data
            request.prompt_len = len(data)
        else:
            ids = (ctypes.c_int32 * max(len(prompt), 1))(*prompt)
            request.prompt_tokens = ids
            request.n_prompt_tokens = len(prompt)
        request.sampling = ctypes.pointer(sampling)
        lora_name = lora.encode() if lora else None  # alive until the request ends
        request.lora = lora_name
        request.lora_scale = lora_scale

        # polychip_generate blocks until the request ends, so it runs on a thread of its own;
        # the callback hands each piece to this generator through a queue.
        pieces = queue.Queue()
        cancel = threading.Event()
        done = object()

        def on_token(user_data, token, piece, piece_len):
            pieces.put((token, ctypes.string_at(piece, piece_len).decode("utf-8", "replace")))
            return 1 if cancel.is_set() else 0

        request.on_token = _TokenCallback(on_token)
        result = _Result()
        result.struct_size = ctypes.sizeof(_Result)
        failure = []

        def run():
            try:
                _check(_lib.polychip_generate(self._handle, ctypes.byref(request),
                                              ctypes.byref(result)))
            except Error as e:
                failure.append(e)
            finally:
                pieces.put(done)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        try:
            while True:
                item = pieces.get()
                if item is done:
                    break
                if tokens:
                    yield item
                elif item[1]:
                    yield item[1]
        finally:
            cancel.set()
            worker.join()
            self.last_finish = FINISH_REASONS[result.finish]  # "cancelled" after a break
        if failure:
            raise failure[0]
