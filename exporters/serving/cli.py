"""``loadlens serve``: the instrumented OpenAI-compatible server.

Every flag has a ``LOADLENS_*`` environment variable (shown in ``--help``). A broken profile, knob, SLO
file or upstream URL is rejected before the server starts (exit 2, one line).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporters.serving.engines.openai.upstream_kinds import KINDS as UPSTREAM_KINDS
from loadlens.util.cliutil import UsageError, env_arg, non_negative_int, port_number, positive_float

if TYPE_CHECKING:
    from loadlens.contracts import mfu

DEFAULT_PORT = 8000


def _knob(text: str) -> tuple[str, Any]:
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # bare strings such as scheduling_policy=priority
    return name.strip(), value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the instrumented OpenAI-compatible server (sim engine or proxy)",
        description=(
            "Serve /v1/chat/completions and /v1/completions with Prometheus metrics (/metrics), OTLP traces "
            "(OTEL_* variables) and one structured log line per request. Engines: 'sim' simulates a vLLM-like "
            "server on a given GPU and model; 'openai' proxies to any OpenAI-compatible upstream."
        ),
    )
    env_arg(p, "--engine", choices=["sim", "openai"], default="sim", help="engine behind the HTTP layer")
    env_arg(p, "--upstream", default=None, help="upstream base URL for --engine openai, e.g. http://127.0.0.1:8001")
    env_arg(p, "--upstream-api-key", default=None, help="bearer token sent to the upstream (openai engine)")
    env_arg(
        p,
        "--upstream-kind",
        choices=["auto", *UPSTREAM_KINDS],
        default="auto",
        help="openai engine: the upstream's server, for its adapter endpoints and context length; auto detects it "
        "from /v1/models (and TGI's /info)",
    )
    env_arg(
        p,
        "--upstream-max-connections",
        type=non_negative_int,
        default=1024,
        help="openai engine: at most this many connections to the upstream (0 = unbounded); more requests wait",
    )
    env_arg(
        p,
        "--upstream-connect-timeout",
        type=positive_float,
        default=5.0,
        help="openai engine: seconds to open a connection to the upstream (then 503)",
    )
    env_arg(
        p,
        "--upstream-read-timeout",
        type=positive_float,
        default=600.0,
        help="openai engine: seconds to wait for the upstream's next bytes (its answer, then each chunk)",
    )
    env_arg(
        p,
        "--upstream-probe-dir",
        type=Path,
        default=None,
        help="openai engine: the upstream's probe directory (loadlens vLLM plugin); its LoRA loads, on-demand ones "
        "included, become swap windows for the blocking attribution",
    )
    env_arg(
        p,
        "--upstream-probe-hostname",
        default=None,
        help="with --upstream-probe-dir: use only documents written on this hostname (the upstream's container or "
        "pod), for a directory several servers share; default: every document",
    )
    env_arg(p, "--model-profile", default="tiny", help="sim model profile: a name (see --list-profiles) or a YAML path")
    env_arg(p, "--gpu-profile", default="h100-sxm", help="sim GPU profile: a name or a YAML path")
    env_arg(p, "--served-model-name", default=None, help="model name clients use (sim; default: the profile name)")
    env_arg(p, "--speed", type=positive_float, default=1.0, help="sim time compression: 10 runs the GPU 10x faster")
    env_arg(p, "--seed", type=non_negative_int, default=0, help="sim random seed (output text, lengths, jitter)")
    env_arg(p, "--jitter", type=float, default=0.0, help="sim step-time jitter: lognormal sigma, 0 = deterministic")
    env_arg(
        p,
        "--knob",
        type=_knob,
        action="append",
        default=None,
        help="engine knob NAME=VALUE at start, repeatable (env: comma-separated), e.g. scheduling_policy=priority",
    )
    env_arg(
        p,
        "--enable-mfu-metrics",
        action="store_true",
        default=False,
        help="export vLLM's MFU counters vllm:estimated_{flops,read_bytes,write_bytes}_per_gpu_total (vLLM's flag "
        "of the same name): the sim counts its steps; the openai engine estimates them from token counts and "
        "--model-config",
    )
    env_arg(
        p,
        "--enable-logging-iteration-details",
        action="store_true",
        default=False,
        help="sim: write vLLM's line for each engine step to stderr (vLLM's flag of the same name): its context "
        "and generation requests and tokens, its elapsed time, the KV usage",
    )
    env_arg(
        p,
        "--model-config",
        default=None,
        help="openai engine, with --enable-mfu-metrics: the upstream model's shape, a Hugging Face config.json, a "
        "model directory holding one, or a sim model profile name or YAML",
    )
    env_arg(p, "--host", default="127.0.0.1", help="address to bind")
    env_arg(p, "--port", type=port_number, default=DEFAULT_PORT, help="TCP port")
    env_arg(p, "--admin-token", default=None, help="bearer token required by admin and LoRA endpoints (prefer the env)")
    env_arg(p, "--lora-root", type=Path, default=None, help="directory that runtime LoRA paths must resolve inside")
    env_arg(p, "--slo-file", type=Path, default=None, help="SLO file (default: the packaged slos.yaml)")
    env_arg(p, "--log-format", choices=["logfmt", "json"], default="logfmt", help="request log line format")
    env_arg(p, "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="log level")
    p.add_argument("--list-profiles", action="store_true", help="print the packaged sim profiles and exit")
    p.add_argument(
        "--write-tokenizer",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json) for --model-profile that "
        "counts tokens as the sim does, loadable offline by transformers/tokenizers (guidellm), and exit",
    )
    p.set_defaults(handler=run)


def _knob_overrides(args: argparse.Namespace) -> dict[str, Any]:
    # LOADLENS_KNOB items first, then --knob flags: a flag overrides the same knob from the environment.
    return dict(args.knob or [])


def _mfu_shape(args: argparse.Namespace) -> mfu.Shape | None:
    """The openai engine's MFU shape (``loadlens/contracts/mfu.py``): None without --enable-mfu-metrics."""
    if not args.enable_mfu_metrics:
        if args.model_config is not None:
            raise UsageError("--model-config is read only with --enable-mfu-metrics")
        return None
    if args.model_config is None:
        raise UsageError(
            "--enable-mfu-metrics with --engine openai needs --model-config (a config.json, model directory or "
            "sim model profile): the proxy estimates the counters from the model's shape"
        )
    from loadlens.contracts import mfu, model_config

    try:
        return mfu.shape(model_config.resolve(args.model_config))
    except model_config.ModelConfigError as err:
        raise UsageError(f"--model-config {err}") from err


def build_engine(args: argparse.Namespace, registry: Any) -> Any:
    """Construct the engine from CLI args; every user mistake raises UsageError."""
    from exporters.serving.engine import EngineError

    if args.engine == "openai":
        from exporters.serving.engines.openai.engine import OpenAIProxyEngine

        if not args.upstream:
            raise UsageError("--engine openai needs --upstream URL (or LOADLENS_UPSTREAM)")
        if _knob_overrides(args):
            raise UsageError("--knob applies to the sim engine only; configure the upstream server itself")
        if args.enable_logging_iteration_details:
            raise UsageError("--enable-logging-iteration-details applies to the sim engine only; start the upstream "
                             "vLLM with it")  # fmt: skip
        shape = _mfu_shape(args)
        try:
            engine = OpenAIProxyEngine(
                args.upstream,
                api_key=args.upstream_api_key,
                connect_timeout_s=args.upstream_connect_timeout,
                read_timeout_s=args.upstream_read_timeout,
                max_connections=args.upstream_max_connections,
                registry=registry,
                upstream_kind=args.upstream_kind,
                mfu_shape=shape,
            )
        except ValueError as err:
            raise UsageError(str(err)) from err
        if args.upstream_probe_dir is not None:
            if args.upstream_probe_dir.exists() and not args.upstream_probe_dir.is_dir():
                raise UsageError(f"--upstream-probe-dir {args.upstream_probe_dir} is not a directory")
            from exporters.serving.engines.openai.probe_swap_feed import ProbeSwapFeed

            ProbeSwapFeed(
                args.upstream_probe_dir, engine.swap_windows, registry=registry, hostname=args.upstream_probe_hostname
            ).start()
        return engine

    if args.upstream_probe_dir is not None or args.upstream_probe_hostname:
        raise UsageError("--upstream-probe-dir applies to --engine openai only (the sim knows its own swaps)")
    if args.upstream_kind != "auto":
        raise UsageError("--upstream-kind applies to --engine openai only")
    if args.model_config is not None:
        raise UsageError("--model-config applies to --engine openai only (the sim's model is --model-profile)")
    from exporters.serving.engines.sim import ProfileError, SimEngine, load_gpu_profile, load_model_profile
    from exporters.serving.engines.sim.iteration_details import IterationDetailsLogger

    try:
        model = load_model_profile(args.model_profile)
        gpu = load_gpu_profile(args.gpu_profile)
    except ProfileError as err:
        raise UsageError(str(err)) from err
    try:
        return SimEngine(
            model,
            gpu,
            registry=registry,
            served_model_name=args.served_model_name,
            speed=args.speed,
            seed=args.seed,
            jitter=args.jitter,
            knobs=_knob_overrides(args),
            enable_mfu_metrics=args.enable_mfu_metrics,
            stat_loggers=[IterationDetailsLogger(_stderr_line)] if args.enable_logging_iteration_details else (),
        )
    except (EngineError, ValueError) as err:
        raise UsageError(str(err)) from err


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _write_tokenizer(args: argparse.Namespace) -> int:
    from exporters.serving.engines.sim import ProfileError, load_model_profile
    from exporters.serving.engines.sim.hf_tokenizer import write_tokenizer

    try:
        profile = load_model_profile(args.model_profile)
    except ProfileError as err:
        raise UsageError(str(err)) from err
    try:
        paths = write_tokenizer(args.write_tokenizer, profile, args.served_model_name)
    except OSError as err:
        raise UsageError(f"--write-tokenizer {args.write_tokenizer}: {err.strerror or err}") from err
    for path in paths:
        print(path)
    return 0


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from prometheus_client import CollectorRegistry

    from exporters.serving.app import ServeSettings, create_app
    from exporters.serving.request_log import configure_logging
    from loadlens.contracts.slo import SLOConfigError, load_slos

    if args.list_profiles:
        from exporters.serving.engines.sim import list_profiles

        for kind, names in list_profiles().items():
            print(f"{kind}: {', '.join(names)}")
        return 0
    if args.write_tokenizer is not None:
        return _write_tokenizer(args)
    if args.lora_root is not None and not args.lora_root.is_dir():
        raise UsageError(f"--lora-root {args.lora_root} is not a directory")
    if args.jitter < 0:
        raise UsageError(f"--jitter must be >= 0, got {args.jitter}")
    try:
        slos = load_slos(args.slo_file)
    except SLOConfigError as err:
        raise UsageError(str(err)) from err
    registry = CollectorRegistry()
    engine = build_engine(args, registry)
    configure_logging(args.log_level)
    settings = ServeSettings(
        admin_token=args.admin_token or None, lora_root=args.lora_root, log_format=args.log_format, slos=slos
    )
    app = create_app(engine, settings, registry=registry)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    # Fewer, cheaper garbage collections: the per-token path allocates many short-lived objects, and a
    # full collection over everything imported at start-up stalls the event loop (and the sim's clock).
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    detail = (
        f"upstream={args.upstream} upstream_kind={args.upstream_kind}"
        if args.engine == "openai"
        else f"model={args.model_profile} gpu={args.gpu_profile}"
    )
    print(
        f"loadlens serve: engine={args.engine} {detail} on http://{args.host}:{args.port}", file=sys.stderr, flush=True
    )
    server.run()
    return 0 if server.started else 1
