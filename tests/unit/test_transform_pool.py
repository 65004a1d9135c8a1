"""The transform pool on its own: real worker processes, pipelined calls, limits."""

import json
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


def big_document(size: int) -> bytes:
    return document(body=json.dumps({"blob": "x" * size}).encode(), headers=[], query="", event={})


def test_large_requests_and_answers_in_both_directions_at_once_do_not_deadlock():
    """Senders writing big requests while the worker writes big answers: the reader
    must never wait for a sender (found in review: 40 calls of 300 KB on one worker
    got no answer in 15 s)."""
    pool = Pool(size=1, timeout=5, megabytes=256)
    answers = []
    try:
        threads = [
            threading.Thread(
                target=lambda: answers.append(pool.run("{body: .body}", big_document(300_000)))
            )
            for _ in range(20)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(answers) == 20
        assert all(answer[0]["body"]["blob"] == "x" * 300_000 for answer in answers)
    finally:
        pool.close()


def test_a_big_call_behind_a_runaway_is_answered_after_the_runaway_is_stopped(pool):
    done = {}

    def call(name, program, doc):
        try:
            done[name] = pool.run(program, doc)
        except TransformError as exc:
            done[name] = str(exc)

    runaway = threading.Thread(target=call, args=("runaway", "last(range(1e15))", DOC))
    runaway.start()
    big = threading.Thread(
        target=call, args=("big", "{body: .body.blob | length}", big_document(200_000))
    )
    big.start()
    for thread in (runaway, big):
        thread.join(30)
    assert done == {"runaway": "the transform ran longer than 0.5 s", "big": [{"body": 200_000}]}


def test_an_answer_nested_too_deep_to_read_back_fails_its_own_call_only(pool):
    deep = document(body=b"[" * 990 + b"]" * 990, headers=[], query="", event={})
    with pytest.raises(TransformError, match="could not be read back"):
        pool.run("{body: .body}", deep)
    assert pool.run(".body", DOC) == [{"n": 1}]
