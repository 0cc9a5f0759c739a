"""CRP-RAG's reasoning graph as data: its invariants (:func:`check_dag`), path selection
(:func:`select_paths`) and the other pure functions over the node dicts."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

__all__ = ["check_dag", "select_paths", "best_path_score", "node_by_id", "known_conditions"]


def check_dag(nodes: Sequence[Mapping[str, Any]]) -> None:
    """Raise ValueError unless ``nodes`` is a DAG: unique ids, known parents, every edge going
    from a lower depth to the next depth (which rules out cycles), roots at depth 1.

    Example:
        >>> check_dag([{"id": 0, "depth": 1, "parents": []}, {"id": 1, "depth": 2, "parents": [0]}])
        >>> check_dag([{"id": 0, "depth": 1, "parents": [0]}])
        Traceback (most recent call last):
        ...
        ValueError: node 0 at depth 1 has parent 0 at depth 1 (edges go one depth down)
    """
    by_id = {n["id"]: n for n in nodes}
    if len(by_id) != len(nodes):
        raise ValueError("node ids are not unique")
    for node in nodes:
        if not node["parents"] and node["depth"] != 1:
            raise ValueError(f"node {node['id']} has no parent but depth {node['depth']}")
        for parent in node["parents"]:
            if parent not in by_id:
                raise ValueError(f"node {node['id']} has unknown parent {parent}")
            if by_id[parent]["depth"] != node["depth"] - 1:
                raise ValueError(f"node {node['id']} at depth {node['depth']} has parent {parent} at depth "
                                 f"{by_id[parent]['depth']} (edges go one depth down)")


def _children(nodes: Sequence[Mapping[str, Any]]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {n["id"]: [] for n in nodes}
    for node in nodes:
        for parent in node["parents"]:
            children[parent].append(node["id"])
    return children


def select_paths(nodes: Sequence[Mapping[str, Any]], *, max_paths: int) -> list[list[int]]:
    """Source-to-sink paths whose every node is sufficient, best first, at most ``max_paths``.

    A path's cost is its worst node perplexity (``score``); ties go to the shorter path, then to
    lower node ids, so the choice never depends on dict or set order.

    Example:
        >>> g = [{"id": 0, "depth": 1, "parents": [], "sufficient": True, "score": 3.0},
        ...      {"id": 1, "depth": 2, "parents": [0], "sufficient": True, "score": 2.0},
        ...      {"id": 2, "depth": 2, "parents": [0], "sufficient": False, "score": 30.0}]
        >>> select_paths(g, max_paths=3)
        [[0, 1]]
    """
    if max_paths < 1:
        raise ValueError("max_paths must be >= 1")
    by_id = {n["id"]: n for n in nodes}
    children = _children(nodes)
    found: list[list[int]] = []

    def walk(path: list[int]) -> None:
        # Paths are at most max_depth long and nodes at most max_nodes: the walk is bounded.
        kids = children[path[-1]]
        if not kids:
            found.append(list(path))
            return
        for kid in kids:
            if by_id[kid].get("sufficient"):
                walk([*path, kid])

    for node in nodes:
        if not node["parents"] and node.get("sufficient"):
            walk([node["id"]])
    found.sort(key=lambda p: (max(by_id[i]["score"] for i in p), len(p), p))
    return found[:max_paths]


def best_path_score(nodes: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """The lowest worst-node perplexity over all source-to-sink paths, sufficient or not (what a
    threshold is calibrated on: the question is answered exactly when this is below it)."""
    if not nodes:
        return None
    scored = [{**n, "sufficient": n.get("score") is not None} for n in nodes]
    best = select_paths(scored, max_paths=1)
    if not best:
        return None
    by_id = {n["id"]: n for n in nodes}
    return max(float(by_id[i]["score"]) for i in best[0])


def node_by_id(nodes: Sequence[Mapping[str, Any]], node_id: int) -> Mapping[str, Any]:
    """The node dict whose ``id`` is ``node_id``."""
    return next(n for n in nodes if n["id"] == node_id)


def known_conditions(sink: Optional[Mapping[str, Any]], by_id: Mapping[int, Mapping[str, Any]]) -> str:
    """The known conditions of a sink: its ancestors (shallowest first) and itself."""
    if sink is None:
        return "(none yet)"
    seen: dict[int, Mapping[str, Any]] = {}
    todo = [sink["id"]]
    while todo:  # the graph is a DAG with at most max_nodes nodes: bounded
        current = by_id[todo.pop()]
        if current["id"] in seen:
            continue
        seen[current["id"]] = current
        todo.extend(current["parents"])
    ordered = sorted(seen.values(), key=lambda n: (n["depth"], n["id"]))
    return "\n".join(f"- {n['text']}" for n in ordered)
