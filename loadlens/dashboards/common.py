"""What the loadlens dashboards share: Prometheus selectors, template variables, SLO lines, annotations.

Metric names come from the exporters (exporters/serving/metrics.py, exporters/serving/engines/sim/,
exporters/gpu/collectors/, loadgen/metrics.py); tests/dashboards proves every query returns data against a
live sim run.
"""

from __future__ import annotations

from loadlens.contracts.ports import GPU_JOB, LOADGEN_JOB, SERVE_JOB, job_selector
from loadlens.dashboards.model import Annotation, Target, Variable

# Selectors. Server-side series carry the vLLM-style `model_name` (gen_ai_* carry `gen_ai_request_model`);
# load-generator series carry `stage`; GPU series carry `gpu`. `$instance` narrows to one scrape target of
# the dashboard's own job; the load generator is its own job, so its selectors leave `instance` alone.
SERVE = f'{job_selector(SERVE_JOB)}, model_name=~"$model", instance=~"$instance"'
SERVE_ANY = f'{job_selector(SERVE_JOB)}, instance=~"$instance"'
GENAI = f'{job_selector(SERVE_JOB)}, gen_ai_request_model=~"$model", instance=~"$instance"'
CLIENT = f'{job_selector(LOADGEN_JOB)}, model_name=~"$model", stage=~"$stage"'
LOADGEN = job_selector(LOADGEN_JOB)
GPU_ON_INSTANCE = f'{job_selector(GPU_JOB)}, instance=~"$instance"'
GPU = f'{GPU_ON_INSTANCE}, gpu=~"$gpu"'
LOADGEN_STAGE = LOADGEN + ', stage=~"$stage"'
CLIENT_FAILED = CLIENT + ', outcome!="success"'
SLO_LEGEND = "SLO {{priority_class}}"
SLO_DASHED = "^SLO .*"


def slo_line(slo: str) -> Target:
    return Target(f'max by (priority_class) (loadlens_slo_threshold_seconds{{slo="{slo}"}})', SLO_LEGEND)


def stage_annotation() -> Annotation:
    # One region per stage: the series is 1 while its stage runs, so each change of stage starts a new one.
    return Annotation("Stage", f"max by (stage) (loadlens_loadgen_stage{{{LOADGEN}}}) == 1", "stage {{stage}}", "blue")


def alerts_annotation() -> Annotation:
    return Annotation(
        "Firing alerts",
        'ALERTS{alertstate="firing"}',
        "{{alertname}}",
        "red",
        text="{{severity}} {{job}}",
    )


def variables(instance_metric: str, *, gpu: bool = False) -> tuple[Variable, ...]:
    out = [
        Variable("model", "Model", f"label_values(loadlens_requests_total{{{job_selector(SERVE_JOB)}}}, model_name)"),
        Variable("instance", "Instance", f"label_values({instance_metric}, instance)"),
        Variable("stage", "Stage", f"label_values(loadlens_loadgen_stage{{{LOADGEN}}}, stage)"),
    ]
    if gpu:
        out.append(
            Variable(
                "gpu", "GPU", f'label_values(loadlens_gpu_info{{{job_selector(GPU_JOB)}, instance=~"$instance"}}, gpu)'
            )
        )
    return tuple(out)
