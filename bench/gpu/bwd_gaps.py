"""Where the GPU idles inside the backward of ``scenarios.py ddp_ws1`` (one GPU):

    python bench/gpu/bwd_gaps.py [BATCH]      # default 64 (gpu_workload.GPU_BOUND_BATCH)

Runs the scenario at BATCH and, from its profiler trace, prints per backward range the GPU span,
the union of its activities (busy), the host range's length, the activities per stream and the
largest gaps between them, with how late the next activity was launched after the GPU ran out of
work (a gap that equals that delay is the GPU waiting for the host). Writes the full figures to
$OUT/bwd_gaps_bBATCH.json (or /tmp). ``BWD_GAPS_SMOKE=1``: the control flow on CPU (gloo)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_trace as ktrace  # noqa: E402
import scenarios  # noqa: E402


def _op(o: Any) -> str:
    return f"{o.name[:50]} s{o.stream}"


def backward_gaps(tr: "ktrace.Trace", limit: int = 20) -> List[Dict[str, Any]]:
    """Per backward range: GPU span and busy time (us), the host range, streams, the largest gaps."""
    rows = []
    for r in tr.ranges_named("rs_bwd")[:limit]:
        ops = sorted(tr.ops_launched_in(r.start, r.end), key=lambda o: o.start)
        if not ops:
            continue
        span = max(o.end for o in ops) - ops[0].start
        busy = ktrace.union_length(ktrace.merge((o.start, o.end) for o in ops))
        streams: Dict[str, List[float]] = {}
        for o in ops:
            st = streams.setdefault(str(o.stream), [0, 0.0])
            st[0] += 1
            st[1] = round(st[1] + o.end - o.start, 1)
        gaps = []
        end, prev = ops[0].end, ops[0]
        for o in ops[1:]:
            if o.start - end > 20:
                gaps.append({"gap_us": round(o.start - end, 1), "after": _op(prev), "next": _op(o),
                             "next_launch_minus_prev_end_us": None if o.launch is None else round(o.launch - end, 1),
                             "next_at_us_in_range": round(o.start - ops[0].start, 1)})
            if o.end > end:
                end, prev = o.end, o
        first = ops[0]
        prev_end = max((o.end for o in tr.ops if o.stream == first.stream and o.end <= first.start), default=None)
        rows.append({"span_us": round(span, 1), "busy_us": round(busy, 1), "ratio": round(busy / span, 3),
                     "host_range_us": round(r.end - r.start, 1), "first_op": _op(first),
                     "first_start_minus_prev_end_on_stream_us": None if prev_end is None else round(first.start - prev_end, 1),
                     "streams": streams, "n_ops": len(ops), "gaps": sorted(gaps, key=lambda g: -g["gap_us"])[:8],
                     "gap_total_us": round(sum(g["gap_us"] for g in gaps), 1)})
    return rows


def main() -> int:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else scenarios.W.GPU_BOUND_BATCH
    out: Dict[str, Any] = {"batch": batch}
    load = ktrace.Trace.load.__func__

    def load_and_read(cls: Any, path: Any) -> "ktrace.Trace":  # the scenario deletes its trace once read
        tr = load(cls, path)
        out["bwd_ranges"] = backward_gaps(tr)
        return tr

    ktrace.Trace.load = classmethod(load_and_read)  # type: ignore[method-assign]
    res = scenarios.run("ddp_ws1", steps=20, warmup=3, trace_dir=Path("/tmp/ranksight-gpu-traces"), batch=batch,
                        smoke=bool(os.environ.get("BWD_GAPS_SMOKE")))
    p = out["profiler"] = res["profiler"]
    out["host_seconds_measured"] = res["host_seconds_measured"]
    dest = Path(os.environ.get("OUT", "/tmp")) / f"bwd_gaps_b{batch}.json"
    dest.write_text(json.dumps(out, indent=1))
    print(json.dumps({"bwd_s": p["bwd"], "bwd_busy_s": p["bwd_busy"], "bwd_ratio": p["bwd_busy"] / max(p["bwd"], 1e-9),
                      "fwd_ratio": p["fwd_busy"] / max(p["fwd"], 1e-9), "host_s": res["host_seconds_measured"]}))
    for row in out.get("bwd_ranges", [])[:3]:
        print(json.dumps({k: v for k, v in row.items() if k != "gaps"}))
        for g in row["gaps"][:5]:
            print("   ", json.dumps(g))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
