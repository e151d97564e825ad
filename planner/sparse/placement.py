"""The embedding block's placement (planner.sparse.embeddings' docstring): the relaxation's chosen options placed
on ranks longest-processing-time-first under the memory limits (Graham 1969), improved by moving pieces off the
slowest rank, and a finished plan's pieces moved to faster placements where memory is left."""
from __future__ import annotations

import numpy as np

from partita.costmodel.sparse.costs import Option, PieceCost
from partita.planner.sparse.problem import SPREAD, Assignment, _Problem, _nodes, _tally


def _place(p: _Problem, choice: list[int]) -> list[Assignment] | None:
    """Longest processing time first onto the least loaded rank (node, for table_row_wise) with room,
    then moves off the slowest rank while they shorten it. None if some piece finds no room."""
    R = p.ctx.ranks
    load, hbm, host = np.zeros(R), np.zeros(R), np.zeros(R)
    fixed_ranks: dict[int, tuple[int, ...]] = {}
    pieces = []
    for t, o in enumerate(choice):
        opt, c = p.costs[t][o]
        if opt.sharding in SPREAD:
            load += c.time_s
            hbm += c.hbm_bytes
            host += c.host_bytes
            fixed_ranks[t] = tuple(range(R))
        else:
            pieces.append((opt.sharding == "table_row_wise", c.time_s, t))
    pieces.sort(key=lambda x: (not x[0], -x[1], x[2]))
    placed: dict[int, list[int]] = {}
    for is_node, _, t in pieces:
        opt, c = p.costs[t][choice[t]]
        ranks = _ranks_for(p, opt, c, load, hbm, host)
        if ranks is None:
            return None
        load[ranks] += c.time_s
        hbm[ranks] += c.hbm_bytes
        host[ranks] += c.host_bytes
        if is_node:
            fixed_ranks[t] = tuple(ranks)
        else:
            placed[t] = ranks
    _improve(p, choice, placed, load, hbm, host)
    fixed_ranks.update({t: tuple(sorted(rs)) for t, rs in placed.items()})
    return [Assignment(table=p.tables[t], option=p.costs[t][o][0], cost=p.costs[t][o][1], ranks=fixed_ranks[t])
            for t, o in enumerate(choice)]


def _improve(p, choice, placed, load, hbm, host, rounds: int = 10_000) -> None:
    """Move a piece from the slowest rank to the least loaded one that has room, while that lowers the
    slowest rank's load (each move strictly lowers the sum of squared loads, so this ends)."""
    for _ in range(rounds):
        worst = int(np.argmax(load))
        best_move = None
        for t, rs in placed.items():
            if worst not in rs:
                continue
            c = p.costs[t][choice[t]][1]
            for r in np.argsort(load, kind="stable"):
                r = int(r)
                if r in rs or hbm[r] + c.hbm_bytes > p.hbm_cap or host[r] + c.host_bytes > p.host_cap:
                    continue
                if load[r] + c.time_s < load[worst] - 1e-15:
                    gain = load[worst] - max(load[r] + c.time_s, load[worst] - c.time_s)
                    if best_move is None or gain > best_move[0]:
                        best_move = (gain, t, r)
                break
        if best_move is None:
            return
        _, t, r = best_move
        c = p.costs[t][choice[t]][1]
        placed[t][placed[t].index(worst)] = r
        for arr, v in ((load, c.time_s), (hbm, c.hbm_bytes), (host, c.host_bytes)):
            arr[worst] -= v
            arr[r] += v


def _ranks_for(p: _Problem, opt: Option, c: PieceCost, load, hbm, host) -> list[int] | None:
    """Where option `opt` goes on ranks loaded `load` (its table taken off): every rank (spread), the node
    whose slowest rank is least loaded (table_row_wise), or its pieces on the least loaded ranks with room;
    None where it finds no room."""
    R = p.ctx.ranks
    room = (hbm + c.hbm_bytes <= p.hbm_cap) & (host + c.host_bytes <= p.host_cap)
    if opt.sharding in SPREAD:
        return list(range(R)) if room.all() else None
    if opt.sharding == "table_row_wise":
        n_nodes, per_node = _nodes(p)
        spans = [range(n * per_node, (n + 1) * per_node) for n in range(n_nodes)]
        ok = [list(s) for s in spans if room[list(s)].all()]
        return min(ok, key=lambda s: (load[s].max(), s[0])) if ok else None
    fits = np.flatnonzero(room)
    if len(fits) < opt.shards:
        return None
    return sorted(int(r) for r in fits[np.lexsort((fits, load[fits]))[:opt.shards]])


def _faster_where_room(p: _Problem, assignments: list[Assignment]) -> list[Assignment]:
    """Each table on the fastest of its options with the same pieces (sharding and count) that still fits on
    the ranks it holds -- a cache or host placement back into HBM where there is room. The step time only
    minimises the slowest rank, so the solver leaves tables off the critical path on any placement that
    fits; this pass runs them as fast as memory allows. Only their own ranks get faster: no rank's time grows."""
    sol = _tally(p, assignments, "", "", 0.0)
    hbm, host = sol.rank_hbm.copy(), sol.rank_host.copy()
    out = list(assignments)
    index = {t.name: i for i, t in enumerate(p.tables)}
    order = sorted(range(len(out)), key=lambda i: -out[i].cost.time_s)
    for i in order:
        a = out[i]
        idx = list(a.ranks)
        for opt, c in sorted(p.costs[index[a.table.name]], key=lambda oc: oc[1].time_s):
            if c.time_s >= a.cost.time_s:
                break
            if (opt.sharding, opt.shards) != (a.option.sharding, a.option.shards):
                continue
            if (max(hbm[idx]) - a.cost.hbm_bytes + c.hbm_bytes <= p.hbm_cap
                    and max(host[idx]) - a.cost.host_bytes + c.host_bytes <= p.host_cap):
                hbm[idx] += c.hbm_bytes - a.cost.hbm_bytes
                host[idx] += c.host_bytes - a.cost.host_bytes
                out[i] = Assignment(table=a.table, option=opt, cost=c, ranks=a.ranks)
                break
    return out
