"""The OpenMetrics generator: every series the agent exposes for the scenario, at the scrape interval."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from ranksight import __version__
from ranksight import catalog as C
from ranksight import triage
from .scenario import AGENT_PORT, K_VARIANTS, Scenario, Shape, node_name
from .model import Model


# ------------------------------------------------------------------------------ series layout
EXTRA_LABEL_VALUES = {"quantile", "reason", "lint", "stat", "state", "xid", "counter", "device", "direction",
                      "port", "path", "collector", "result", "name", "uuid", "driver", "version", "python",
                      "category", "gpu", "where", "phase", "op", "pg", "dtype",
                      "torch", "cuda", "nccl", "stage", "strategy", "zero_stage"}


def _scope(m: C.Metric) -> str:
    if m.labels[:len(C.RANK_LABELS)] == C.RANK_LABELS:
        return "rank"
    if m.labels[:len(C.GPU_LABELS)] == C.GPU_LABELS:
        return "gpu"
    if m.labels[:len(C.NODE_LABELS)] == C.NODE_LABELS:
        return "node"
    return "?"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def modelled(m: C.Metric) -> bool:
    """False for a family whose extra labels the generator cannot invent values for."""
    base = {"rank": C.RANK_LABELS, "gpu": C.GPU_LABELS, "node": C.NODE_LABELS}.get(_scope(m))
    if base is None:
        return False
    extra = m.labels[len(base):]
    return all(x in EXTRA_LABEL_VALUES for x in extra)


@dataclass
class Counts:
    series: int = 0
    samples: int = 0
    bytes: int = 0
    by_scope: Dict[str, int] = field(default_factory=dict)  # series per scope for ONE normal node
    families: int = 0


class Generator:
    """Writes the OpenMetrics text for a slice of nodes."""

    def __init__(self, scn: Scenario):
        self.scn = scn
        self.model = Model(scn)
        self.suffix_ts = [f" {t}\n" for t in self.model.ts]
        self._suffix: Dict[Tuple[str, str, int, Tuple[str, ...]], str] = {}
        agent = [m for m in C.CATALOG.values() if m.source == "agent"]  # what a node agent exposes
        self.metrics = [m for m in agent if modelled(m)]
        self.not_modelled = sorted(m.name for m in agent if not modelled(m))
        self.straggler_set = set(scn.stragglers)

    def _profile_rank(self, node: int, rank: int) -> str:
        if rank in self.straggler_set:
            return "straggler"
        if node == self.scn.dataloader_node:
            return "dataloader"
        return "normal"

    def _profile_gpu(self, node: int, gpu: int) -> str:
        rpn = self.scn.shape.ranks_per_node
        if node == self.scn.dataloader_node:
            return "dataloader"
        if gpu < rpn and node * rpn + gpu in self.straggler_set:
            return "straggler"
        return "normal"

    def _suffixes(self, m: C.Metric, profile: str, v: int) -> Dict[Tuple[str, ...], List[str]]:
        """extra-label key -> list of ' value ts\\n' strings (cached per profile/variant)."""
        ck = (m.short, profile, v)
        got = self._suffix.get(ck)  # type: ignore[arg-type]
        if got is None:
            ts = self.suffix_ts
            got = {k: [" " + x + t for x, t in zip(vals, ts)]
                   for k, vals in self.model.values(m, profile, v).values.items()}
            self._suffix[ck] = got  # type: ignore[index]
        return got  # type: ignore[return-value]

    @staticmethod
    def _type_line(m: C.Metric) -> str:
        if m.type == "counter":
            return f"# TYPE {m.name[:-len('_total')]} counter\n"
        if m.type == "histogram":
            return f"# TYPE {m.name} histogram\n"
        return f"# TYPE {m.name} gauge\n"

    def _uuid(self, node: int, gpu: int) -> str:
        return f"GPU-{node:08x}-{gpu:04x}-4e1c-9a1f-{self.scn.seed:012x}"

    def _labels_extra(self, m: C.Metric, node: int, gpu: int, key: Tuple[str, ...]) -> str:
        """Render the family's extra labels from the model's key."""
        base_len = {"rank": len(C.RANK_LABELS), "gpu": len(C.GPU_LABELS), "node": len(C.NODE_LABELS)}[_scope(m)]
        extra = m.labels[base_len:]
        if m.short == "gpu_info":
            vals = ("NVIDIA H200", self._uuid(node, gpu), "580.159.04")
        elif m.short == "rank_gpu_info":  # ``gpu`` is the rank's local rank here: local rank i on GPU i
            vals = (str(gpu), self._uuid(node, gpu).lower())
        elif m.short == "rank_versions_info":
            vals = ("2.11.0+cu130", "13.0", "2.27.7")
        elif m.short == "rank_parallel_info":
            vals = ("ddp", "")
        elif m.short == "build_info":
            vals = (__version__, "3.11.7")
        else:
            vals = key
        return "".join(f',{k}="{_esc(x)}"' for k, x in zip(extra, vals))

    def write(self, out, nodes: Sequence[int]) -> Counts:
        scn = self.scn
        rpn, gpus = scn.shape.ranks_per_node, scn.shape.gpus
        cnt = Counts()
        probe = next((n for n in nodes if n != scn.dataloader_node), None)
        for m in self.metrics:
            scope = _scope(m)
            out.write(self._type_line(m))
            cnt.bytes += len(self._type_line(m))
            cnt.families += 1
            for n in nodes:
                node = node_name(n)
                inst = f'instance="{node}:{AGENT_PORT}"'
                if scope == "rank":
                    ents = [(self._profile_rank(n, n * rpn + lr), f'{{{inst},job="{_esc(scn.job)}",node="{node}",'
                             f'rank="{n * rpn + lr}",local_rank="{lr}"', lr, (n * rpn + lr) % K_VARIANTS)
                            for lr in range(rpn)]
                elif scope == "gpu":
                    ents = [(self._profile_gpu(n, g), f'{{{inst},job="{triage.SCRAPE_JOB}",node="{node}",gpu="{g}"',
                             g, (n * gpus + g) % K_VARIANTS) for g in range(gpus)]
                else:
                    ents = [("dataloader" if n == scn.dataloader_node else "normal",
                             f'{{{inst},job="{triage.SCRAPE_JOB}",node="{node}"', 0, n % K_VARIANTS)]
                for profile, lab, idx, v in ents:
                    for key, sufs in self._suffixes(m, profile, v).items():
                        if m.type == "histogram":
                            part = key[0]
                            if part == "bucket":
                                prefix = f'{m.bucket}{lab},le="{key[1]}"}}'
                            else:
                                prefix = f"{m.name}_{part}{lab}}}"
                        else:
                            prefix = f"{m.name}{lab}{self._labels_extra(m, n, idx, key)}}}"
                        chunk = prefix + prefix.join(sufs)
                        out.write(chunk)
                        cnt.series += 1
                        cnt.samples += len(sufs)
                        cnt.bytes += len(chunk)
                        if n == probe:
                            cnt.by_scope[scope] = cnt.by_scope.get(scope, 0) + 1
        # what Prometheus adds to every scrape of a target
        for name in ("up", "scrape_duration_seconds", "scrape_samples_scraped",
                     "scrape_samples_post_metric_relabeling", "scrape_series_added"):
            out.write(f"# TYPE {name} gauge\n")
            for n in nodes:
                prefix = f'{name}{{instance="{node_name(n)}:{AGENT_PORT}",job="{triage.SCRAPE_JOB}"}}'
                val = {"up": "1", "scrape_duration_seconds": "0.041"}.get(name, "1300")
                sufs = [" " + val + t for t in self.suffix_ts]
                chunk = prefix + prefix.join(sufs)
                out.write(chunk)
                cnt.series += 1
                cnt.samples += len(sufs)
                cnt.bytes += len(chunk)
                if n == probe:
                    cnt.by_scope["scrape"] = cnt.by_scope.get("scrape", 0) + 1
        out.write("# EOF\n")
        return cnt


def series_per_node(shape: Shape) -> Dict[str, int]:
    """Series one healthy node exposes (plus Prometheus' 5 scrape series), by scope, from the model."""
    scn = Scenario(nodes=2, shape=shape, t0=0, samples=1, dataloader_node=-1)
    g = Generator(scn)

    class _Null:
        def write(self, s: str) -> None:
            pass

    c = g.write(_Null(), [0])
    by = dict(c.by_scope)
    by["per_rank"] = by.get("rank", 0) // max(shape.ranks_per_node, 1)
    by["per_gpu"] = by.get("gpu", 0) // max(shape.gpus, 1)
    by["total"] = sum(c.by_scope.values())
    return by


# ------------------------------------------------------------------------------ Prometheus and promtool
