"""The transform pool on its own: real worker processes, pipelined calls, limits."""

import threading

import pytest

from deliveries.transforms import document
from deliveries.transforms.pool import Pool, TransformError

DOC = document(body=b'{"n": 1}', headers=[], query="", event={})


@pytest.fixture
def pool():
    pool = Pool(size=1, timeout=0.5, megabytes=128)
    yield pool
    pool.close()


def test_calls_queued_behind_a_runaway_are_answered_by_a_new_worker(pool):
    answers = {}

    def call(name, program):
        try:
            answers[name] = pool.run(program, DOC)
        except TransformError as exc:
            answers[name] = str(exc)

    runaway = threading.Thread(target=call, args=("runaway", "last(range(1e15))"))
    runaway.start()
    behind = [threading.Thread(target=call, args=(n, f"{{body: {n}}}")) for n in range(5)]
    for thread in behind:
        thread.start()
    for thread in (runaway, *behind):
        thread.join(30)

    assert answers.pop("runaway") == "the transform ran longer than 0.5 s"
    assert answers == {n: [{"body": n}] for n in range(5)}


def test_a_worker_that_ran_out_of_memory_is_replaced(pool):
    with pytest.raises(TransformError, match="more than 128 MB"):
        pool.run('reduce range(40) as $i ("x"; . + .)', DOC)
    assert pool.run(".body", DOC) == [{"n": 1}]


def test_the_body_is_parsed_from_the_text_and_at_most_two_values_come_back(pool):
    assert pool.run("[.body, .text]", DOC) == [[{"n": 1}, '{"n": 1}']]
    assert pool.run("range(1e15)", DOC) == [0, 1]
    not_json = document(body=b"\xff\xfe", headers=[], query="", event={})
    assert pool.run("[.body, .text]", not_json) == [[None, None]]


def test_a_closed_pool_refuses_calls(pool):
    pool.close()
    with pytest.raises(TransformError, match="stopping"):
        pool.run(".", DOC)
