"""The hang watch's verdict (runtime.failure.hang): the ranks furthest behind are the ones holding the others up."""
import json
import time

from partita.runtime.failure import hang


def _mark(d, rank, step, phase, pid=1000):
    (d / hang.FILE.format(rank)).write_text(json.dumps({"rank": rank, "pid": pid + rank, "step": step, "phase": phase}))


def test_the_rank_behind_is_named_with_where_it_and_the_others_stopped(tmp_path):
    _mark(tmp_path, 0, 3, 1)
    _mark(tmp_path, 1, 3, 0)
    _mark(tmp_path, 2, 3, 1)
    (tmp_path / "hang-rank9.json").write_text("{not json")  # a torn or foreign file is no mark
    places = hang.marks(tmp_path)
    assert sorted(places) == [0, 1, 2] and places[1]["pid"] == 1001
    line, blamed = hang.verdict(places, 5.0)
    assert blamed == [1]
    assert line.startswith("no progress for more than 5 s (--hang-timeout) in forward and backward of step 3")
    assert "while rank 0, 2 waited in the loss all-reduce" in line


def test_ranks_a_step_behind_and_ranks_all_waiting_alike(tmp_path):
    line, blamed = hang.verdict({0: {"step": 4, "phase": 0}, 1: {"step": 3, "phase": 3}, 2: {"step": 3, "phase": 3}},
                                2.0)
    assert blamed == [1, 2] and line.startswith("ranks 1, 2 made no progress")
    assert "in the checkpoint save of step 3" in line and "forward and backward of step 4" in line
    line, blamed = hang.verdict({0: {"step": 7, "phase": 2}, 1: {"step": 7, "phase": 2}}, 2.0)
    assert blamed == [] and "every rank of this node (0, 1)" in line and "the optimizer step of step 7" in line
    assert "another node" in line


def test_work_between_marks_keeps_the_rank_alive_and_close_removes_its_mark(tmp_path):
    """An evaluation calls still_going after each batch: the rank's place stays, its clock restarts (a long
    evaluation under --hang-timeout is no hang)."""
    watch = hang.HangWatch(60.0, tmp_path, rank=3)
    watch.after_step(5, 1.0, 0.1)
    assert hang.HangWatch.current is watch and hang.marks(tmp_path)[3]["step"] == 5
    watch.since -= 100  # as if the evaluation had run for 100 s
    hang.still_going()
    assert watch.place == (5, 3) and watch.since > time.monotonic() - 5
    watch.close()
    assert hang.HangWatch.current is None and hang.marks(tmp_path) == {}
    hang.still_going()  # no watch: nothing to do
