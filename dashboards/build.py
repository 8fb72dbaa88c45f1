"""The three ranksight dashboards, built with grafana-foundation-sdk from the triage table
(ranksight/triage/) and the metric catalog (ranksight/catalog.py): ``BOARDS`` lists them.

panels.py is the panel library (PromQL helpers, panel builders, variables, ``Board``);
triage_board.py, ranks_board.py and node_board.py build one dashboard each. The library's
names are re-exported here.

Imported only by ``generate.render()``: the SDK is an optional dependency.
"""
from __future__ import annotations

from .node_board import RDMA_CONGESTION_NAMED, RDMA_ERRORS_NAMED, node_board  # noqa: F401
from .panels import *  # noqa: F401,F403
from .panels import _known_series  # noqa: F401
from .ranks_board import ranks_board
from .triage_board import triage_board

BOARDS = (("ranksight-triage.json", triage_board), ("ranksight-ranks.json", ranks_board),
          ("ranksight-node.json", node_board))
