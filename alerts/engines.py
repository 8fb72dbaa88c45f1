"""The rule file for another evaluation engine, derived from the Prometheus one (``render_rules``).

Prometheus evaluates a group's rules in order and a rule sees the samples the earlier rules of its
group wrote at the same evaluation. vmalert (VictoriaMetrics) writes a group's results through
remote write, so a rule that reads an earlier rule of its own group sees that rule's previous
evaluation, or nothing at the first one (the step-time baseline group, evaluated every 5 minutes,
then records nothing for 5 to 10 minutes). ``victoriametrics(text)`` rewrites every such read so it
needs no result of the same evaluation, with the value Prometheus computes:

- an instant read ``R`` of an earlier record: its expression ``(E)`` in place;
- an instant read with matchers ``R{m}`` of a record whose expression is one range function over a
  plain record of another group, ``f(X[d])``: ``f(X{m}[d])`` (the matchers pushed inside; every such
  record keeps the labels of ``X``);
- ``min_over_time(R[d])`` / ``max_over_time(R[d])`` (a baseline over the record's history): the
  history's extreme together with the current value, ``((H < (E)) or (E) or H)`` for the minimum
  (``>`` for the maximum), which is what Prometheus reads with this evaluation's sample in the range;
- ``last_over_time(R[d])``: the current value where the record has one, else the history's last,
  ``((E) or last_over_time(R[d]))``.

Each group of more than one rule then gets ``concurrency`` (GROUP_CONCURRENCY): vmalert evaluates
that many of its rules at once, which the rewrite makes safe.

Any other read of an earlier record of the same group raises ``EngineError``: a test renders both
engines, so a rule the rewrite cannot carry fails there, not in a deployment. Groups, intervals,
alerts, labels and annotations are unchanged.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Tuple

import yaml

ENGINES = ("prometheus", "victoriametrics")
_NAME = r"[a-zA-Z_:][\w:]*"
_SINGLE_RANGE = re.compile(rf"^(\w+)\(({_NAME})(\{{[^{{}}]*\}})?\[(\w+)\]\)$")
_EXTREMES = {"min_over_time": "<", "max_over_time": ">"}
# rules of one group vmalert evaluates at once (its group field ``concurrency``; 1 by default, one
# rule after another): once no rule reads another's result of the same evaluation, a group's wall
# time is its slowest rules', not their sum
GROUP_CONCURRENCY = 4


class EngineError(ValueError):
    """A rule reads an earlier rule of its group in a way the rewrite cannot carry."""


def _push_matchers(expr: str, matchers: str) -> str:
    """``f(X[d])`` read as ``R{matchers}`` -> ``f(X{matchers}[d])``."""
    m = _SINGLE_RANGE.match(expr.strip())
    if not m:
        raise EngineError(f"cannot push {matchers} into {expr!r}")
    func, name, own, rng = m.groups()
    inner = matchers[1:-1] if not own else own[1:-1] + ", " + matchers[1:-1]
    return f"{func}({name}{{{inner}}}[{rng}])"


def _rewrite(expr: str, resolvers: Mapping[str, Callable[[str], str]]) -> str:
    """Every read of a record of ``resolvers`` in ``expr`` replaced, in one pass (see the module doc);
    ``resolvers[name](matchers)`` is that record's expression for those matchers ("" for none), free
    of same-group reads."""
    if not resolvers:
        return expr
    names = "|".join(re.escape(n) for n in sorted(resolvers, key=len, reverse=True))
    pat = re.compile(rf"(?<![\w:])(\w+\()?({names})(\{{[^{{}}]*\}})?(\[\w+\])?(?![\w:])")
    out, pos = [], 0
    for m in pat.finditer(expr):
        func, name, matchers, rng = m.group(1), m.group(2), m.group(3) or "", m.group(4)
        if m.start() < pos:
            continue
        current = resolvers[name](matchers)
        end = m.end()
        if rng is None:
            piece = (func or "") + f"({current})"
        elif func and func[:-1] in _EXTREMES and expr[end:end + 1] == ")":
            history = f"{func}{name}{matchers}{rng})"
            op = _EXTREMES[func[:-1]]
            piece = f"(({history} {op} ({current})) or ({current}) or {history})"
            end += 1  # the range function's closing parenthesis is in `history`
        elif func == "last_over_time(" and expr[end:end + 1] == ")":
            history = f"{func}{name}{matchers}{rng})"
            piece = f"(({current}) or {history})"
            end += 1
        else:
            raise EngineError(f"{name}{matchers}{rng} is read as a range by {func or 'a subquery'} in {expr!r}")
        out.append(expr[pos:m.start()] + piece)
        pos = end
    out.append(expr[pos:])
    return "".join(out)


def _free(expr: str, earlier: List[Tuple[str, str]]) -> str:
    """``expr`` with every read of the records in ``earlier`` ((record, its own expression), in
    group order) rewritten so it needs no result of the same evaluation."""
    resolvers: Dict[str, Callable[[str], str]] = {}
    for i, (name, own) in enumerate(earlier):
        def resolve(matchers: str, own: str = own, before: List[Tuple[str, str]] = earlier[:i]) -> str:
            return _free(_push_matchers(own, matchers) if matchers else own, before)
        resolvers[name] = resolve
    return _rewrite(expr, resolvers)


def _group_free(rules: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    earlier: List[Tuple[str, str]] = []
    out = []
    for r in rules:
        out.append({**r, "expr": _free(r["expr"], earlier)})
        if "record" in r:
            earlier.append((r["record"], r["expr"]))
    return out


def victoriametrics(text: str, concurrency: int = GROUP_CONCURRENCY) -> str:
    """The rule file ``text`` (``ranksight-rules.yml``) for vmalert: see the module doc.
    ``concurrency``: the most rules of a group evaluated at once; 0, all of them."""
    head = "".join(ln + "\n" for ln in text.splitlines() if ln.startswith("#"))
    doc = yaml.safe_load(text) or {}
    groups = []
    for g in doc.get("groups", []):
        rules = _group_free(g.get("rules") or [])
        group = {**g, "rules": rules}
        if len(rules) > 1:  # no rule needs another's result of the same evaluation (above): run them at once
            group["concurrency"] = min(len(rules), concurrency) if concurrency > 0 else len(rules)
        groups.append(group)
    body = yaml.safe_dump({"groups": groups}, sort_keys=False, default_flow_style=False, width=100000,
                          allow_unicode=True)
    return head + "# Engine: VictoriaMetrics (vmalert): same-group reads rewritten by ranksight.alerts.engines.\n" + body


def render(text: str, engine: str) -> str:
    if engine == "prometheus":
        return text
    if engine == "victoriametrics":
        return victoriametrics(text)
    raise EngineError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
