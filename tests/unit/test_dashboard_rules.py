"""The Grafana dashboard (`deploy/grafana/mythic-dashboard.json`) and the Prometheus alert rules
(`deploy/prometheus/alerts.yml`): their structure, and the PromQL reading that finds the metric
names they use. `tests/integration/test_dashboard.py` checks those names against a live
server's /metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

DASHBOARD = ROOT / "deploy" / "grafana" / "mythic-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

PROMETHEUS_SERIES = frozenset({"up"})
"""Series Prometheus itself adds to every target: a rule may name them."""

FUNCTIONS = frozenset(
    [
        "abs",
        "absent",
        "absent_over_time",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_avg",
        "histogram_count",
        "histogram_fraction",
        "histogram_quantile",
        "histogram_stddev",
        "histogram_stdvar",
        "histogram_sum",
        "holt_winters",
        "double_exponential_smoothing",
        "hour",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log10",
        "log2",
        "mad_over_time",
        "max_over_time",
        "min_over_time",
        "minute",
        "month",
        "predict_linear",
        "present_over_time",
        "quantile_over_time",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sort",
        "sort_desc",
        "sort_by_label",
        "sort_by_label_desc",
        "sqrt",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "time",
        "timestamp",
        "vector",
        "year",
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atanh",
        "cos",
        "cosh",
        "deg",
        "pi",
        "rad",
        "sin",
        "sinh",
        "tan",
        "tanh",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
        "start",
        "end",
    ]
)
"""PromQL's functions and aggregation operators."""

KEYWORDS = frozenset(
    [
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
    ]
)
_LABEL_LISTS = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_OFFSETS = re.compile(r"\boffset\s+-?(?:\d+(?:ms|[smhdwy]))+", re.IGNORECASE)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_TOKENS = re.compile(
    r"(?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?))"
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<call>\s*\()?"
    r"|(?P<other>\S)"
)
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<metric>[^,()]+?)\s*,\s*)?\w+\s*\)\s*$")


class PromQLError(ValueError):
    """An expression this reading does not understand (an unknown function)."""


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once its strings, label
    matchers, ranges, Grafana variables and label lists (`by (...)`, `on (...)`...) are taken
    out (and an `offset`'s duration) and its functions, aggregations, keywords and numbers
    are set aside.

    Raises:
        PromQLError: the expression calls a function PromQL does not have.
    """
    text = _STRINGS.sub(" ", expr)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", " ", text)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers (strings already gone)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges and subqueries
    text = _LABEL_LISTS.sub(" ", text)
    text = _OFFSETS.sub(" ", text)
    names: set[str] = set()
    for token in _TOKENS.finditer(text):
        name = token["name"]
        if name is None:
            continue
        if token["call"]:
            if name not in FUNCTIONS:
                raise PromQLError(f"unknown PromQL function {name!r} in {expr!r}")
            continue
        if name.lower() in KEYWORDS or name in FUNCTIONS:
            continue  # `sum by (x) (...)` leaves `sum` before the parenthesis of its argument
        names.add(name)
    return names


def template_metric_names(query: str) -> set[str]:
    """The metric names of a Grafana Prometheus template query: `label_values(metric, label)`
    or a PromQL expression (`query_result(...)` is read as its expression)."""
    found = _LABEL_VALUES.match(query)
    if found:
        return metric_names(found["metric"]) if found["metric"] else set()
    inner = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.DOTALL)
    return metric_names(inner[1] if inner else query)


def exported_names(exposition: str) -> set[str]:
    """Every series name a /metrics text makes queryable, by family type: a counter's `_total`
    (and `_created`), a histogram's `_bucket`, `_sum` and `_count`, a summary's quantiles,
    `_sum` and `_count`; families declared without samples count too."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
        "summary": ("", "_sum", "_count", "_created"),
        "info": ("_info",),
        "stateset": ("",),
        "gauge": ("",),
        "unknown": ("",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return board


def load_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that shows data (rows' nested panels included; rows themselves not)."""
    for panel in board.get("panels", []):
        if panel.get("type") == "row":
            yield from panels(panel)
        else:
            yield panel


def references(board: dict[str, Any], rules: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each (where, metric name) the dashboard's targets and template queries and the rules'
    expressions name."""
    found: list[tuple[str, str]] = []
    for panel in panels(board):
        for target in panel.get("targets", []):
            where = f"panel {panel['title']!r} target {target.get('refId')}"
            found += [(where, n) for n in sorted(metric_names(target["expr"]))]
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            where = f"variable {variable['name']!r}"
            found += [(where, n) for n in sorted(template_metric_names(text))]
    for rule in rules:
        where = f"rule {rule.get('alert') or rule.get('record')!r}"
        found += [(where, n) for n in sorted(metric_names(rule["expr"]))]
    return found


def missing(references: Iterable[tuple[str, str]], exported: set[str]) -> list[str]:
    """`where: name` for each referenced name that is not exported (nor Prometheus's own)."""
    return [
        f"{where}: {name}"
        for where, name in references
        if name not in exported and name not in PROMETHEUS_SERIES
    ]


# -- the PromQL reading -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("mythic_sessions", {"mythic_sessions"}),
        (
            'sum by (code) (rate(mythic_errors_total{code!="x",instance=~"$instance"}[5m]))',
            {"mythic_errors_total"},
        ),
        (
            "histogram_quantile(0.95, sum by (le) "
            "(rate(mythic_x_seconds_bucket[$__rate_interval])))",
            {"mythic_x_seconds_bucket"},
        ),
        (
            "a / on (instance) group_left (engine) b offset 5m > bool 1e-9",
            {"a", "b"},
        ),
        ("sum(rate(x[5m:1m])) without (job) or vector(0)", {"x"}),
        ("rate(x[5m] offset -1h30m) @ start()", {"x"}),
        ('label_replace(up, "by", "$1", "instance", "(.*)")', {"up"}),
        ("max(y{quantile='0.95'}) > 0.25 and deriv(z[30m]) > .5", {"y", "z"}),
        (
            'count(mythic_turns_total{finish="stop"} unless ignoring(finish) w)',
            {"mythic_turns_total", "w"},
        ),
    ],
)
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_an_unknown_function_is_an_error() -> None:
    with pytest.raises(PromQLError, match="rates"):
        metric_names("rates(mythic_turns_total[5m])")


def test_template_queries() -> None:
    assert template_metric_names("label_values(mythic_sessions, instance)") == {"mythic_sessions"}
    assert template_metric_names("label_values(instance)") == set()
    assert template_metric_names("query_result(topk(3, mythic_npc_actors))") == {
        "mythic_npc_actors"
    }


EXPOSITION = """\
# HELP mythic_turns_total NPC turns
# TYPE mythic_turns_total counter
mythic_turns_total{finish="stop"} 3.0
# HELP mythic_errors_total errors
# TYPE mythic_errors_total counter
# HELP mythic_x_seconds a histogram
# TYPE mythic_x_seconds histogram
mythic_x_seconds_bucket{le="+Inf"} 1.0
mythic_x_seconds_count 1.0
mythic_x_seconds_sum 0.2
# HELP mythic_sessions sessions
# TYPE mythic_sessions gauge
mythic_sessions 1.0
"""


def test_exported_names_by_family_type() -> None:
    names = exported_names(EXPOSITION)
    assert {"mythic_turns_total", "mythic_errors_total", "mythic_sessions"} <= names
    assert {"mythic_x_seconds_bucket", "mythic_x_seconds_sum", "mythic_x_seconds_count"} <= names
    assert "mythic_turns" not in names and "mythic_sessions_total" not in names


def test_a_made_up_metric_is_reported_with_its_panel_and_rule() -> None:
    board = {
        "panels": [
            {
                "type": "row",
                "title": "r",
                "panels": [
                    {"title": "Turns", "targets": [{"refId": "A", "expr": "mythic_turns_total"}]}
                ],
            },
            {
                "title": "Ghosts",
                "targets": [{"refId": "B", "expr": "rate(mythic_ghosts_total[5m])"}],
            },
        ]
    }
    rules = [
        {"alert": "Haunted", "expr": "mythic_haunted_seconds_bucket > 1"},
        {"alert": "Down", "expr": "up == 0"},
    ]
    found = references(board, rules)
    assert len(found) == 4
    assert missing(found, exported_names(EXPOSITION)) == [
        "panel 'Ghosts' target B: mythic_ghosts_total",
        "rule 'Haunted': mythic_haunted_seconds_bucket",
    ]


# -- the files' structure -----------------------------------------------------------------------


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    board = load_dashboard()
    assert board["title"] and board["uid"]
    assert board["schemaVersion"] >= 39  # Grafana 10.4 and later
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    shown = list(panels(board))
    assert len(shown) >= 25
    for panel in shown:
        title = panel.get("title")
        assert title, panel
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel.get("targets"), f"panel {title!r} has no target"
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), f"panel {title!r} has an empty target"
            assert target["datasource"]["uid"] == "${datasource}", title
            assert metric_names(target["expr"]), f"panel {title!r} names no metric"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, title


_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")


def test_every_alert_rule_has_what_an_operator_needs() -> None:
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert set(document) == {"groups"}
    rules = load_rules()
    assert len(rules) >= 10
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), "alert names repeat"
    for rule in rules:
        name = rule["alert"]
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert rule["expr"].strip(), name
        assert metric_names(rule["expr"]), f"rule {name!r} names no metric"
        assert _DURATION.match(str(rule["for"])), f"rule {name!r}: `for` {rule['for']!r}"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"]["summary"].strip(), name
    severities = {r["labels"]["severity"] for r in rules}
    assert severities == {"critical", "warning"}


def test_every_name_in_the_files_is_checked_by_the_live_test() -> None:
    """The integration test checks at least this many references: none may read as nothing."""
    found = references(load_dashboard(), load_rules())
    assert len(found) >= 60
    assert len({name for _, name in found}) >= 40


# -- the /dashboard page ------------------------------------------------------------------------

PAGE = ROOT / "src" / "mythic" / "server" / "dashboard"


def test_the_page_writes_text_only_and_loads_nothing_from_elsewhere() -> None:
    """NPC lines are untrusted: the script puts them in the page as text, never as HTML; and
    the page names no other origin (its content security policy would refuse it anyway)."""
    from mythic.server._dashboard import PAGE_FILES

    assert set(PAGE_FILES) == {"index.html", "dashboard.js", "dashboard.css"}
    script = (PAGE / "dashboard.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink
    assert "textContent" in script
    for name in PAGE_FILES:
        text = (PAGE / name).read_text(encoding="utf-8")
        assert not re.search(r"(?:https?:)?//[\w.-]+\.\w", text), f"{name} names another origin"
    page = (PAGE / "index.html").read_text(encoding="utf-8")
    assert "<script>" not in page and "onload=" not in page  # no inline script
