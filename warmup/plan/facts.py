"""ServerFacts: the server settings a plan may refer to, from one of four sources.

* in-process: a resolved ``sglang.srt.server_args.ServerArgs`` plus SGLang's TokenizerManager
  (:func:`from_tokenizer_manager`);
* over HTTP: the ``/server_info`` JSON (:func:`from_server_info`);
* offline: SGLang launch flags parsed and resolved by SGLang's own parser and resolution
  pipeline (:func:`from_launch_flags`);
* a facts file, YAML or JSON (:func:`warmup.plan.facts_file.from_file`, which checks every
  value).

Every source ends in :func:`from_settings`, so the four agree on names and defaulting.  A value
the source could not know is either ``None`` (the plan treats it as "not set") or an assumed
default listed in ``ServerFacts.assumed`` with the reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from cache_tools.locations import environment
from warmup.plan import model_config as model_config_mod
from warmup.errors import FactsError, shown

#: SGLang's page size when none is resolved (its own default).
DEFAULT_PAGE_SIZE = 1
#: SGLang's ``--max-prefill-tokens`` when none is resolved (its own default).
DEFAULT_MAX_PREFILL_TOKENS = 16384
#: Vocabulary assumed when the model config is unknown; warm-up token ids stay below it.
DEFAULT_VOCAB_SIZE = 32000
_FLAGS_HINT = "run `python -m sglang.launch_server --help` for the valid flags"


@dataclass(frozen=True)
class ServerFacts:
    """What a plan may read about the server.  Token counts are per request unless noted.

    Fields that are ``None`` are unknown or not applicable ("not set"): an expression that reads
    one is undefined, which skips the shape with the fact named in the reason.
    """

    #: tokens per prefill forward (``--chunked-prefill-size``); None = chunked prefill off
    chunked_prefill_size: int | None
    #: KV page size in tokens; radix prefix hits are page-granular
    page_size: int
    #: the model's context length (``--context-length`` or the model config)
    context_length: int | None
    #: the longest prompt the server accepts (SGLang's max_req_input_len)
    max_req_input_len: int | None
    #: effective concurrent-request cap per DP rank
    max_running_requests: int | None
    #: KV capacity in tokens (``max_total_num_tokens``); None = unknown
    max_total_tokens: int | None
    #: tokens admitted per prefill step (``--max-prefill-tokens``)
    max_prefill_tokens: int | None
    #: decode CUDA graphs captured at all
    decode_graph: bool
    #: largest batch size with a captured decode graph; above it decode runs eager
    decode_graph_max_bs: int | None
    #: captured decode batch sizes
    decode_graph_bs: tuple[int, ...]
    #: prefill CUDA graph backend ("breakable", "full", "tc_piecewise", "disabled")
    prefill_graph_backend: str
    #: captured prefill token buckets (for prefill, "bs" means token counts)
    prefill_graph_buckets: tuple[int, ...]
    #: the prefill graph's context bucket: batches with a longer context replay eagerly
    prefill_graph_context: int | None
    #: mixed chunk in effect (``--enable-mixed-chunk`` and chunked prefill on)
    enable_mixed_chunk: bool
    disable_radix_cache: bool
    #: "null", "prefill", "decode" or "encode"
    disaggregation_mode: str
    speculative_algorithm: str | None
    tp_size: int
    dp_size: int
    tokenizer_worker_num: int
    vocab_size: int
    model_type: str | None
    #: the model's default sampling parameters (generation config), as SGLang applies them
    default_sampling_params: Mapping[str, Any] = field(default_factory=dict)
    #: SGLang version the facts came from
    sglang_version: str | None = None
    #: where the facts came from ("server_args", "server_info", "launch_flags", "file")
    source: str = "file"
    #: values that were assumed rather than read, each "name=value: why"
    assumed: tuple[str, ...] = ()

    # --- derived facts, visible to plan expressions ------------------------------------------
    @property
    def prefill_graph(self) -> bool:
        return self.prefill_graph_backend not in ("disabled", "", None)

    @property
    def radix_cache(self) -> bool:
        return not self.disable_radix_cache

    @property
    def disaggregation(self) -> bool:
        return self.disaggregation_mode not in ("null", "", None)

    @property
    def max_input_len(self) -> int | None:
        """The longest prompt the plan may send: min(context_length - 1, max_req_input_len)."""
        candidates = [x for x in (self.max_req_input_len,
                                  None if self.context_length is None else self.context_length - 1)
                      if x is not None]
        return min(candidates) if candidates else None

    @property
    def prefill_graph_max_bucket(self) -> int | None:
        return max(self.prefill_graph_buckets) if self.prefill_graph_buckets else None

    @property
    def prefill_budget(self) -> int | None:
        """The most prompt tokens one prefill forward takes: the least of the chunk, the largest
        prefill graph, ``max_prefill_tokens`` set above 0 (None: none is); in whole pages."""
        limits = [v for v in (self.chunked_prefill_size, self.prefill_graph_max_bucket,
                              self.max_prefill_tokens) if v and v > 0]
        return min(limits) if limits else None

    def env(self) -> dict[str, Any]:
        """Name → value for plan expressions (fields and derived facts)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("default_sampling_params", "assumed", "source", "sglang_version"):
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        for name in DERIVED:
            out[name] = getattr(self, name)
        # An empty list is "not set" for expressions (max() of nothing is undefined).
        for name in ("decode_graph_bs", "prefill_graph_buckets"):
            if not out[name]:
                out[name] = None
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["default_sampling_params"] = dict(self.default_sampling_params)
        d["decode_graph_bs"] = list(self.decode_graph_bs)
        d["prefill_graph_buckets"] = list(self.prefill_graph_buckets)
        d["assumed"] = list(self.assumed)
        return d


DERIVED = ("prefill_graph", "radix_cache", "disaggregation", "max_input_len",
           "prefill_graph_max_bucket", "prefill_budget")
#: Every name a plan expression may read from the facts.
FACT_NAMES = frozenset([f.name for f in fields(ServerFacts)
                        if f.name not in ("default_sampling_params", "assumed", "source",
                                          "sglang_version")] + list(DERIVED))


# --- the common constructor ---------------------------------------------------------------------
def sglang_default(assumed: list[str], name: str, value: int | None, default: int) -> int:
    """``value``, or SGLang's own ``default`` where it was not resolved (said in ``assumed``)."""
    if value is None:
        assumed.append(f"{name}={default}: not resolved; SGLang's default")
    return default if value is None else value


def from_settings(s: Mapping[str, Any], *, source: str, assumed: list[str] | None = None,
                  context_length: int | None = None, vocab_size: int | None = None,
                  model_type: str | None = None, max_req_input_len: int | None = None,
                  max_total_tokens: int | None = None, max_running_requests: int | None = None,
                  default_sampling_params: Mapping[str, Any] | None = None,
                  sglang_version: str | None = None) -> ServerFacts:
    """Build facts from a flat mapping of SGLang server-arg names (resolved values)."""
    assumed = list(assumed or [])

    def get_int(name: str) -> int | None:
        return setting_int(name, s.get(name))

    chunk = get_int("chunked_prefill_size")
    if chunk is not None and chunk <= 0:  # SGLang nulls a non-positive chunk size
        chunk = None
    page = sglang_default(assumed, "page_size", get_int("page_size"), DEFAULT_PAGE_SIZE)
    max_prefill = sglang_default(assumed, "max_prefill_tokens", get_int("max_prefill_tokens"),
                                  DEFAULT_MAX_PREFILL_TOKENS)
    cgc = s.get("cuda_graph_config") or {}
    if hasattr(cgc, "to_dict") and not isinstance(cgc, dict):  # a live CudaGraphConfig
        cgc = {p: vars(getattr(cgc, p)) for p in ("decode", "prefill")}
    cgc = _setting_mapping("cuda_graph_config", cgc)
    decode = _setting_mapping("cuda_graph_config.decode", cgc.get("decode") or {})
    prefill = _setting_mapping("cuda_graph_config.prefill", cgc.get("prefill") or {})
    disabled_all = bool(s.get("disable_cuda_graph"))
    decode_backend = str(decode.get("backend") or ("disabled" if disabled_all else "full"))
    if disabled_all:
        decode_backend = "disabled"
    prefill_backend = str(prefill.get("backend") or "disabled")
    if disabled_all or s.get("disable_prefill_cuda_graph"):
        prefill_backend = "disabled"
    decode_bs = _setting_ints("cuda_graph_bs", decode.get("bs") or s.get("cuda_graph_bs") or ())
    decode_max_bs = decode.get("max_bs")
    if decode_max_bs is None:
        decode_max_bs = s.get("cuda_graph_max_bs_decode") or s.get("cuda_graph_max_bs")
    if decode_max_bs is None and decode_bs:
        decode_max_bs = max(decode_bs)
    decode_on = decode_backend != "disabled"
    prefill_buckets = _setting_ints("cuda_graph_config.prefill.bs", prefill.get("bs") or ())
    prefill_on = prefill_backend != "disabled"
    context_bucket = prefill.get("max_seq_len") or prefill.get("max_context_size")

    mixed = bool(s.get("enable_mixed_chunk")) and chunk is not None
    ctx = get_int("context_length") or context_length
    mrr = max_running_requests if max_running_requests is not None else get_int("max_running_requests")
    vocab = vocab_size
    if vocab is None:
        vocab = DEFAULT_VOCAB_SIZE
        assumed.append(f"vocab_size={vocab}: model config not available; token ids stay below it")
    return ServerFacts(
        chunked_prefill_size=chunk,
        page_size=page,
        context_length=ctx,
        max_req_input_len=max_req_input_len,
        max_running_requests=mrr,
        max_total_tokens=max_total_tokens if max_total_tokens is not None else get_int("max_total_tokens"),
        max_prefill_tokens=max_prefill,
        decode_graph=decode_on,
        decode_graph_max_bs=setting_int("cuda_graph_max_bs", decode_max_bs) if decode_on else None,
        decode_graph_bs=decode_bs if decode_on else (),
        prefill_graph_backend=prefill_backend,
        prefill_graph_buckets=prefill_buckets if prefill_on else (),
        prefill_graph_context=(setting_int("cuda_graph_config.prefill.max_seq_len", context_bucket)
                               if prefill_on and context_bucket else None),
        enable_mixed_chunk=mixed,
        disable_radix_cache=bool(s.get("disable_radix_cache")),
        disaggregation_mode=str(s.get("disaggregation_mode") or "null"),
        speculative_algorithm=s.get("speculative_algorithm") or None,
        tp_size=get_int("tp_size") or 1,
        dp_size=get_int("dp_size") or 1,
        tokenizer_worker_num=get_int("tokenizer_worker_num") or 1,
        vocab_size=int(vocab),
        model_type=model_type,
        default_sampling_params=dict(default_sampling_params or {}),
        sglang_version=sglang_version,
        source=source,
        assumed=tuple(assumed),
    )


# --- /server_info -------------------------------------------------------------------------------
def from_server_info(info: Mapping[str, Any]) -> ServerFacts:
    """Facts from SGLang's ``GET /server_info`` JSON (0.5.17 and later)."""
    if not isinstance(info, Mapping) or "chunked_prefill_size" not in info:
        raise FactsError("the /server_info answer has no server settings",
                         hint="point --url at an SGLang server (0.5.17 or later)")
    states = info.get("internal_states") or [{}]
    first = states[0] if states and isinstance(states[0], Mapping) else {}
    mrr = first.get("effective_max_running_requests_per_dp") or info.get("max_running_requests")
    assumed = ["default_sampling_params={}: /generate does not expose the model's generation "
               "config; the server's own defaults apply"]
    return from_settings(
        info, source="server_info", assumed=assumed,
        context_length=int_or_none(info.get("context_length")),
        max_req_input_len=int_or_none(info.get("max_req_input_len")),
        max_total_tokens=int_or_none(info.get("max_total_num_tokens")),
        max_running_requests=int_or_none(mrr),
        vocab_size=int_or_none(info.get("vocab_size")),
        sglang_version=info.get("version"),
    )


def setting_int(name: str, v: Any) -> int | None:
    """A server setting as an integer (None: unset); FactsError naming it when it is none (a
    fraction, infinity and NaN included)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        if isinstance(v, float) and not v.is_integer():
            raise ValueError(v)
        return int(v)
    except (TypeError, ValueError, OverflowError):
        raise FactsError(f"server setting {name}={shown(v)} is not an integer",
                         hint="check the facts source") from None


def _setting_ints(name: str, v: Any) -> tuple[int, ...]:
    items = tuple(setting_int(name, x) for x in v) if isinstance(v, (list, tuple)) else (None,)
    if None in items:
        raise FactsError(f"server setting {name}={shown(v)} is not a list of integers",
                         hint="check the facts source")
    return items  # type: ignore[return-value]


def _setting_mapping(name: str, v: Any) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise FactsError(f"server setting {name}={shown(v)} is not a mapping", hint="check the facts source")
    return v


def int_or_none(v: Any) -> int | None:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError, OverflowError):   # a server's odd answer is an unknown fact
        return None


# --- offline: SGLang's own parser and resolution ----------------------------------------------
def from_launch_flags(flags: str | list[str], *, model_config: str | None = None) -> ServerFacts:
    """Facts from ``sglang.launch_server`` flags, parsed and resolved by the installed SGLang.

    Offline there is no model download: ``--model-path`` must be a local directory with a
    ``config.json``, a Hugging Face model id whose config sits in the local Hugging Face cache
    (:func:`warmup.plan.model_config.find`), or a model with a shipped stand-in; or
    ``model_config`` names a directory with one (it replaces the model path for resolution
    only).  Without a GPU, resolution runs as for ``--device cuda`` with unknown accelerator
    memory, so memory-derived values (KV capacity, the running-request cap when not given) are
    unknown and listed as such.
    """
    argv = _split_flags(flags) if isinstance(flags, str) else list(flags)
    assumed: list[str] = []
    model_path = _flag_value(argv, "--model-path") or _flag_value(argv, "--model")
    if model_config:
        cfg_dir = Path(model_config)
        if cfg_dir.is_file():
            cfg_dir = cfg_dir.parent
        if not (cfg_dir / "config.json").is_file():
            raise FactsError(f"{model_config}: no config.json there",
                             hint="pass the directory that holds the model's config.json")
        argv = _set_flag(argv, "--model-path", str(cfg_dir))
        assumed.append(f"model config from {cfg_dir} (stands in for {model_path})")
    elif model_path is None:
        raise FactsError("the launch flags have no --model-path",
                         hint="add --model-path (a local directory) or pass --model-config DIR")
    elif not (Path(model_path) / "config.json").is_file():
        found, how = model_config_mod.find(model_path, _flag_value(argv, "--revision"))
        argv = _set_flag(argv, "--model-path", str(found))
        assumed.append(how)
    if _flag_value(argv, "--device") is None and not _has_gpu():
        argv = argv + ["--device", "cuda"]
        assumed.append("device=cuda: no accelerator here; resolved as for CUDA with unknown memory")
    if "--skip-tokenizer-init" not in argv:
        argv = argv + ["--skip-tokenizer-init"]  # offline: the tokenizer files are not needed
    if _flag_value(argv, "--log-level") is None:
        argv = argv + ["--log-level", "warning"]  # resolution's INFO lines are not facts
    import warnings

    # SGLang's import and resolution set process-wide variables as its launcher would (its
    # third-party cache directories); reading facts leaves this process's environment as it was.
    with environment():
        try:  # imported after the checks above: a bad model path fails at once, not after SGLang
            from sglang.srt.server_args import prepare_server_args
        except ImportError as exc:
            raise FactsError(f"SGLang is not importable here ({exc})",
                             hint="install sglang, or use --facts FILE or --url URL") from None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # import-time notes about absent accelerators
                sa = _parse_quietly(prepare_server_args, argv)
                sa.resolve_once()
        except SystemExit as exc:
            raise FactsError(f"SGLang refused the launch flags (exit {exc.code})",
                             hint=_FLAGS_HINT) from None
        except FactsError:
            raise
        except Exception as exc:  # SGLang's own resolution may raise anything: one FactsError
            raise FactsError(f"SGLang could not resolve the launch flags: "
                             f"{type(exc).__name__}: {exc}",
                             hint="fix the flags; SGLang's own message is above") from None
        return from_server_args(sa, source="launch_flags", assumed=assumed)


def _split_flags(flags: str) -> list[str]:
    """``--server-args`` split as a shell would; an unbalanced quote is one line."""
    try:
        return shlex.split(flags)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise FactsError(f"--server-args: {str(exc).lower()} in {shown(flags)}",
                         hint='close the quote, e.g. --server-args "--model-path /m --tp 2"') from None


def _parse_quietly(parse: Any, argv: list[str]) -> Any:
    """SGLang's parser with stderr kept aside: argparse prints its whole usage (some 466 lines)
    before the one ``error:`` line, the only one told."""
    kept = io.StringIO()
    try:
        with contextlib.redirect_stderr(kept):
            args = parse(argv)
    except SystemExit as exc:
        said = [line.partition(": error: ")[2] for line in kept.getvalue().splitlines()
                if ": error: " in line] or [f"argparse exit {exc.code}"]
        raise FactsError(f"SGLang rejected the launch flags: {said[-1]}", hint=_FLAGS_HINT) from None
    sys.stderr.write(kept.getvalue())
    return args


def from_server_args(server_args: Any, *, source: str = "server_args",
                     assumed: list[str] | None = None, tokenizer_manager: Any = None,
                     internal_state: Mapping[str, Any] | None = None) -> ServerFacts:
    """Facts from a resolved ``ServerArgs`` (and, in-process, the TokenizerManager)."""
    assumed = list(assumed or [])
    settings = server_args.resolved_dict() if hasattr(server_args, "resolved_dict") else vars(server_args)
    import sglang

    context_length = vocab = model_type = max_req_input_len = None
    defaults: dict[str, Any] = {}
    model_config = getattr(tokenizer_manager, "model_config", None)
    if model_config is None:
        try:
            from sglang.srt.arg_groups.model_override_base import model_config_of

            model_config = model_config_of(server_args)
        except Exception as exc:  # older SGLang or no model files
            assumed.append(f"model config unavailable ({type(exc).__name__}); context length unknown")
    if model_config is not None:
        context_length = getattr(model_config, "context_len", None)
        vocab = getattr(model_config, "vocab_size", None)
        hf = getattr(model_config, "hf_config", None)
        model_type = getattr(hf, "model_type", None)
        try:
            defaults = dict(model_config.get_default_sampling_params() or {})
        except Exception:  # SGLang's generation config (model files, older releases): none then
            defaults = {}
    if tokenizer_manager is not None:
        context_length = getattr(tokenizer_manager, "context_len", context_length)
        max_req_input_len = getattr(tokenizer_manager, "max_req_input_len", None)
    state = dict(internal_state or {})
    mrr = state.get("effective_max_running_requests_per_dp")
    max_total = _kv_capacity(state)
    if source == "launch_flags":
        if settings.get("max_running_requests") is None:
            assumed.append("max_running_requests=unknown: derived from GPU memory at startup")
        assumed.append("max_total_tokens=unknown: KV capacity is sized from GPU memory at startup")
    return from_settings(settings, source=source, assumed=assumed, context_length=context_length,
                         vocab_size=vocab, model_type=model_type,
                         max_req_input_len=max_req_input_len,
                         max_total_tokens=int_or_none(max_total),
                         max_running_requests=int_or_none(mrr),
                         default_sampling_params=defaults,
                         sglang_version=getattr(sglang, "__version__", None))


async def from_tokenizer_manager(tokenizer_manager: Any) -> ServerFacts:
    """Facts inside SGLang's main process, during ``--warmups``: resolved server args, the model
    config, and the schedulers' live view (effective request cap, KV capacity)."""
    state: dict[str, Any] = {}
    try:
        states = await tokenizer_manager.get_internal_state()
        if states:
            # The smallest rank bounds what every rank can take.
            state = dict(states[0])
            state["max_total_num_tokens"] = _kv_capacity(state)
            for other in states[1:]:
                other = dict(other, max_total_num_tokens=_kv_capacity(other))
                for key in ("effective_max_running_requests_per_dp", "max_total_num_tokens"):
                    if other.get(key) is not None and state.get(key) is not None:
                        state[key] = min(state[key], other[key])
    except Exception:  # older SGLang: no internal state; the args still give the settings
        state = {}
    return from_server_args(tokenizer_manager.server_args, source="server_args",
                            tokenizer_manager=tokenizer_manager, internal_state=state)


def _kv_capacity(state: Mapping[str, Any]) -> Any:
    """A scheduler's KV capacity in tokens from its internal state: SGLang (0.5.17+) reports it
    as ``memory_usage.token_capacity``, not as ``max_total_num_tokens``."""
    if state.get("max_total_num_tokens") is not None:
        return state["max_total_num_tokens"]
    usage = state.get("memory_usage")
    return usage.get("token_capacity") if isinstance(usage, Mapping) else None


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag`` (``--flag V`` or ``--flag=V``) given once, as ``value``."""
    out, skip = [], False
    for a in argv:
        if not skip and a != flag and not a.startswith(flag + "="):
            out.append(a)
        skip = a == flag and not skip  # the word after the flag is its old value
    return out + [flag, value]


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no torch, or one whose CUDA probe fails (any kind): no GPU
        return False


def dump(facts: ServerFacts) -> str:
    return json.dumps(facts.to_dict(), indent=2, sort_keys=True)
