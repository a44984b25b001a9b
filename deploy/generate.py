"""Writes every deploy file that is derived from the Helm chart: `python deploy/generate.py`.

The chart (deploy/helm/procdelta) is the one source of the cluster artifacts; this
script renders it with Helm's own engine (helm-python-sdk, a test dependency) and writes

- the kustomize base, deploy/*.yaml: the chart rendered with deploy/helm/kustomize-base-values.yaml
  (release and namespace `procdelta`), one file per template, Helm's bookkeeping labels
  (`helm.sh/chart`, `app.kubernetes.io/managed-by`) left out since Helm does not manage
  it; deploy/namespace.yaml and deploy/kustomization.yaml are kept by hand;
- deploy/prometheus/procdelta.rules.yml: the PrometheusRule's groups with the default
  thresholds, for a plain Prometheus's `rule_files:`, and procdelta.vmalert.rules.yml, the
  same without `keep_firing_for`, for vmalert before 1.91;
- in the chart: Chart.yaml's version and appVersion (pyproject.toml's version), the
  dashboard (a copy of grafana/procdelta.json, which grafana/dashboard.py writes) and
  the README's table of values (from the `# --` comments of values.yaml).

`--check` writes nothing and exits 1 naming the stale files; tests/integration/test_helm.py fails
on the same comparison.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "procdelta"
BASE_VALUES = DEPLOY / "helm" / "kustomize-base-values.yaml"
RULES = DEPLOY / "prometheus" / "procdelta.rules.yml"
VMALERT_RULES = DEPLOY / "prometheus" / "procdelta.vmalert.rules.yml"
DASHBOARD = ROOT / "grafana" / "procdelta.json"
RELEASE = NAMESPACE = "procdelta"
HELM_BOOKKEEPING = re.compile(r"^\s*(helm\.sh/chart|app\.kubernetes\.io/managed-by): .*\n", re.M)
VALUES_TABLE = re.compile(r"(<!-- values:begin -->\n).*?(<!-- values:end -->)", re.S)
GENERATED = "# Written by `python deploy/generate.py` from {source}; edit that, not this.\n"


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def render(values: dict | None = None, name: str = RELEASE, namespace: str = NAMESPACE):
    """The chart's manifests for these values: {template file name: text}, empty ones out."""
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name=name, namespace=namespace)
    return {
        Path(path).name: text.strip() + "\n"
        for path, text in rendered.items()
        if path.endswith(".yaml") and text.strip()
    }


def base_values() -> dict:
    return yaml.safe_load(BASE_VALUES.read_text())


def kustomize_base() -> dict[Path, str]:
    source = "the chart (deploy/helm, values: deploy/helm/kustomize-base-values.yaml)"
    return {
        DEPLOY / name: GENERATED.format(source=source) + HELM_BOOKKEEPING.sub("", text)
        for name, text in render(base_values()).items()
    }


def rule_file(keep_firing_for: bool = True) -> str:
    """The PrometheusRule's spec as a rule file, its comments kept (cut out as text); for
    vmalert before 1.91 (`keep_firing_for` false), without the field it refuses."""
    values = {"enabled": True, "keepFiringFor": keep_firing_for}
    text = render({"prometheusRule": values})["prometheusrule.yaml"]
    spec = text[text.index("\nspec:\n") + len("\nspec:\n") :]
    lines = [line.removeprefix("  ") for line in spec.splitlines()]
    header = (
        "# procdelta's recording and alerting rules, for `rule_files:` of a plain Prometheus\n"
        "# (the chart's PrometheusRule with its default thresholds). Ratios are formed here,\n"
        "# at query time, from the counters procdelta exports; it never exports a ratio.\n"
    )
    if not keep_firing_for:
        header = (
            "# procdelta's recording and alerting rules for vmalert (`-rule=`) before 1.91,\n"
            "# which refuses `keep_firing_for`: the chart's PrometheusRule with its default\n"
            "# thresholds and prometheusRule.keepFiringFor=false. Newer vmalert, Thanos and\n"
            "# Mimir rulers take procdelta.rules.yml.\n"
        )
    source = "deploy/helm/procdelta/templates/prometheusrule.yaml"
    return GENERATED.format(source=source) + header + "\n".join(lines) + "\n"


def chart_metadata() -> str:
    text = (CHART / "Chart.yaml").read_text()
    for key in ("version", "appVersion"):
        text = re.sub(rf"^{key}: .*$", f"{key}: {version()}", text, flags=re.M)
    return text


def documented_values(text: str) -> list[tuple[str, str]]:
    """(dotted key, description) of each key of values.yaml preceded by a `# --` comment.

    The helm-docs convention: the comment starts with `# -- `, continues on `# ` lines,
    and documents the key on the line after it."""
    documented, path, doc = [], [], None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# -- "):
            doc = [stripped[len("# -- ") :]]
        elif stripped.startswith("#") and doc is not None:
            doc.append(stripped.lstrip("#").strip())
        elif match := re.match(r"^( *)([A-Za-z][\w.-]*):", line):
            depth = len(match.group(1)) // 2
            del path[depth:]
            path.append(match.group(2))
            if doc is not None:
                documented.append((".".join(path), " ".join(doc)))
            doc = None
        elif stripped and not stripped.startswith("-"):
            doc = None
    return documented


def lookup(values: dict, dotted: str) -> Any:
    for key in dotted.split("."):
        values = values[key]
    return values


def undocumented(text: str) -> list[str]:
    """Leaves of values.yaml that neither they nor an ancestor document."""
    documented = {key for key, _ in documented_values(text)}

    def leaves(node: Any, prefix: str) -> list[str]:
        if prefix in documented:
            return []
        if isinstance(node, dict) and node:
            return [
                leaf
                for key, child in node.items()
                for leaf in leaves(child, f"{prefix}.{key}" if prefix else key)
            ]
        return [prefix]

    return leaves(yaml.safe_load(text), "")


def values_table(text: str) -> str:
    values = yaml.safe_load(text)
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for key, description in documented_values(text):
        default = lookup(values, key)
        kind = {bool: "bool", int: "int", float: "float", str: "string", list: "list"}.get(
            type(default), "object"
        )
        shown = json.dumps(default, separators=(", ", ": "))
        rows.append(f"| `{key}` | {kind} | `{shown}` | {description} |")
    return "\n".join(rows) + "\n"


def chart_readme() -> str:
    readme = (CHART / "README.md").read_text()
    table = values_table((CHART / "values.yaml").read_text())
    return VALUES_TABLE.sub(lambda m: m.group(1) + table + m.group(2), readme)


def outputs() -> dict[Path, str]:
    """Every derived file and the text it must hold."""
    undocumented_keys = undocumented((CHART / "values.yaml").read_text())
    if undocumented_keys:
        raise SystemExit(f"values.yaml: no `# --` comment for {', '.join(undocumented_keys)}")
    return {
        **kustomize_base(),
        RULES: rule_file(),
        VMALERT_RULES: rule_file(keep_firing_for=False),
        CHART / "Chart.yaml": chart_metadata(),
        CHART / "README.md": chart_readme(),
        CHART / "dashboards" / "procdelta.json": chart_dashboard(),
    }


CLUSTER_PLACEHOLDER = "__CLUSTER_LABEL__"
"""Where the chart's copy of the dashboard names the cluster label: its template puts
`prometheusRule.clusterLabel` there."""


def chart_dashboard() -> str:
    """grafana/procdelta.json with its cluster label a placeholder (grafana/dashboard.py's
    `with_cluster_label`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dashboard", ROOT / "grafana" / "dashboard.py")
    dashboard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dashboard)
    return dashboard.with_cluster_label(DASHBOARD.read_text(), CLUSTER_PLACEHOLDER)


def stale() -> list[Path]:
    return [
        path for path, text in outputs().items() if not path.exists() or path.read_text() != text
    ]


def main(argv: list[str]) -> int:
    import helm_python

    try:
        return write(check="--check" in argv)
    except helm_python.HelmError as error:  # the chart did not render: say why, in one line
        sys.stderr.write(f"deploy/generate.py: {' '.join(str(error).split())}\n")
        return 1


def write(check: bool) -> int:
    if check:
        paths = stale()
        for path in paths:
            sys.stderr.write(f"stale: {path.relative_to(ROOT)} (run python deploy/generate.py)\n")
        return 1 if paths else 0
    for path, text in outputs().items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            sys.stdout.write(f"wrote {path.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
