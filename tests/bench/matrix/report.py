"""The report: per-row summaries of each broker, the comparison table, the detailed table,
the bytes written to disk per message, the memory run."""

from __future__ import annotations

import statistics

from tests.bench.matrix.rows import NSQD, PYNSQD, Outcome, Scenario


def _roles(s: Scenario) -> tuple[str, ...]:
    return ("writer", "reader") if s.role == "both" else (s.role,)


def summarize(outcomes: list[Outcome], brokers: list[str]) -> list[dict]:
    """Per scenario and role: each broker's rates (msgs/s) run by run, their median, the median
    broker CPU, and pynsqd / nsqd of the medians."""
    rows: dict[tuple[str, str], dict] = {}
    for o in outcomes:
        for role in _roles(o.scenario):
            row = rows.setdefault((o.scenario.name, role), {
                "scenario": o.scenario.name, "role": role, "both": o.scenario.role == "both",
                **{b: {"runs": [], "cpu_percent": [], "errors": []} for b in brokers}})
            side = row[o.broker]
            result = getattr(o, role)
            if o.error or result is None:
                side["errors"].append((o.error or "no result").splitlines()[0])
            else:
                side["runs"].append(result["msgs_per_s"])
                side["cpu_percent"].append(o.broker_cpu_percent)
    for row in rows.values():
        for b in brokers:
            side = row[b]
            side["median"] = statistics.median(side["runs"]) if side["runs"] else None
            cpu = [c for c in side["cpu_percent"] if c is not None]
            side["cpu_percent"] = statistics.median(cpu) if cpu else None
        py, ref = row[PYNSQD]["median"], row[NSQD]["median"] if NSQD in row else None
        row["ratio"] = py / ref if py is not None and ref else None
    return list(rows.values())


def comparison_table(summary: list[dict]) -> str:
    """The side-by-side medians and ratios as one Markdown table."""
    head = ["scenario", "nsqd msgs/s", "pynsqd msgs/s", "pynsqd/nsqd", "nsqd CPU", "pynsqd CPU",
            "runs, k msgs/s (nsqd; pynsqd)"]
    rows = []
    for row in summary:
        ref, py = row[NSQD], row[PYNSQD]
        name = row["scenario"] + (f": {row['role']}" if row.get("both") else "")
        rows.append([name, number(ref["median"]), number(py["median"]),
                     "-" if row["ratio"] is None else f"{row['ratio']:.2f}",
                     _percent(ref["cpu_percent"]), _percent(py["cpu_percent"]), f"{_runs(ref)}; {_runs(py)}"])
    return _markdown(head, rows)


def _runs(side: dict) -> str:
    text = " ".join(f"{x / 1000:,.1f}" for x in side["runs"])
    return text + (f" ({len(side['errors'])} failed)" if side["errors"] else "")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _markdown(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "| " + " | ".join("{:<%d}" % w if i == 0 else "{:>%d}" % w for i, w in enumerate(widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([fmt.format(*head), sep, *(fmt.format(*row) for row in rows)])


def number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(outcomes: list[Outcome]) -> str:
    """Every run with its details (rates, latencies, CPU, memory, machine load) as one Markdown table."""
    head = ["scenario", "writer msgs/s", "writer MB/s", "reader msgs/s", "reader MB/s", "p50 ms", "p99 ms",
            "p999 ms", "broker CPU", "broker peak RSS MB", "tool CPU", "other load"]
    rows = []
    for o in outcomes:
        name = o.scenario.name + (f" [{o.broker} {o.round + 1}]" if len(set(x.broker for x in outcomes)) > 1
                                  or any(x.round for x in outcomes) else "")
        if o.error:
            rows.append([name, f"error: {o.error.splitlines()[0][:80]}"] + [""] * (len(head) - 2))
            continue
        w, r = o.writer or {}, o.reader or {}
        lat = r.get("latency_ms") or {}
        rows.append([
            name,
            number(w.get("msgs_per_s")), number(w.get("mib_per_s"), 1),
            number(r.get("msgs_per_s")), number(r.get("mib_per_s"), 1),
            number(lat.get("p50_ms"), 2), number(lat.get("p99_ms"), 2), number(lat.get("p999_ms"), 2),
            _percent(o.broker_cpu_percent),
            number(o.peak_rss_mb),
            f"{100 * o.tool_cpu_s / o.measured_s:.0f}%" if o.measured_s else "-",
            f"{100 * o.other_cpu_s / o.window_s:.0f}%" if o.window_s else "-",
        ])
    return _markdown(head, rows)


def disk_summary(outcomes: list[Outcome], brokers: list[str]) -> list[dict]:
    """Per scenario measured for disk (the rows with channels): each broker's medians of the
    messages published, of the fan-out rate and of the bytes per message (tests.bench.matrix.disk),
    the runs that did not settle, and pynsqd / nsqd of the fan-out rates and of the data-path
    bytes per message."""
    rows: dict[str, dict] = {}
    for o in outcomes:
        if o.disk is None:
            continue
        row = rows.setdefault(o.scenario.name, {"scenario": o.scenario.name, "channels": o.scenario.channels,
                                                **{b: {"runs": []} for b in brokers}})
        row[o.broker]["runs"].append(o.disk)
    for row in rows.values():
        for b in brokers:
            side = row[b]
            for key in ("messages", "fan_out_msgs_per_s", "data_bytes_per_msg", "write_bytes_per_msg"):
                values = [r[key] for r in side["runs"] if r.get(key) is not None]
                side[key] = statistics.median(values) if values else None
            side["unsettled"] = sum(not r["settled"] for r in side["runs"])
        py, ref = row[PYNSQD], row.get(NSQD)
        rate, ref_rate = py["fan_out_msgs_per_s"], ref and ref["fan_out_msgs_per_s"]
        row["fan_out_ratio"] = rate / ref_rate if rate is not None and ref_rate else None
        data, ref_data = py["data_bytes_per_msg"], ref and ref["data_bytes_per_msg"]
        row["ratio"] = data / ref_data if data is not None and ref_data is not None and ref_data >= 1 else None
    return list(rows.values())


def disk_table(summary: list[dict], brokers: list[str]) -> str:
    """Each broker's medians of the fan-out rate and of the bytes written to disk per published
    message, as one Markdown table."""
    both = len(brokers) > 1
    head = ["scenario"]
    for b in brokers:
        head += [f"{b} msgs", f"{b} fan-out msgs/s"]
    head += ["pynsqd/nsqd"] if both else []
    for b in brokers:
        head += [f"{b} data B/msg", f"{b} write_bytes B/msg"]
    head += ["pynsqd/nsqd (data)"] if both else []
    rows = []
    for row in summary:
        cells = [row["scenario"]]
        for b in brokers:
            side = row[b]
            note = f" ({side['unsettled']} unsettled)" if side["unsettled"] else ""
            cells += [number(side["messages"]), number(side["fan_out_msgs_per_s"]) + note]
        cells += [_ratio(row["fan_out_ratio"])] if both else []
        for b in brokers:
            cells += [number(row[b]["data_bytes_per_msg"]), number(row[b]["write_bytes_per_msg"])]
        cells += [_ratio(row["ratio"])] if both else []
        rows.append(cells)
    return _markdown(head, rows)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(data: dict | list) -> str:
    """The tables of a saved ``--json`` run."""
    if isinstance(data, list):  # a single-broker run
        outcomes = [Outcome.from_dict(d) for d in data]
        disk = disk_summary(outcomes, [PYNSQD])
        return table(outcomes) + (f"\n\n{disk_table(disk, [PYNSQD])}" if disk else "")
    text = comparison_table(data["summary"])
    if data.get("disk"):
        text += "\n\n" + disk_table(data["disk"], list(data["brokers"]))
    return text


def memory_text(result: dict) -> str:
    w, b = result["writer"], result["broker"]
    lines = [f"# {result['scenario']}",
             f"publish: {w['messages']:,} msgs in {w['duration_s']:.1f}s = {w['msgs_per_s']:,.0f} msgs/s",
             f"broker peak RSS {b['peak_rss_mb']:.0f} MB, RSS {b['rss_mb']:.0f} MB, "
             f"data path {b['data_path_mb']:.0f} MB"]
    if "reader" in result:
        r = result["reader"]
        lines.append(f"drain: {r['messages']:,} msgs in {r['duration_s']:.1f}s = {r['msgs_per_s']:,.0f} msgs/s, "
                     f"peak RSS after drain {b['peak_rss_mb_after_drain']:.0f} MB")
    return "\n".join(lines)
