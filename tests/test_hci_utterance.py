"""HCI's reply reads the user's pick-turn utterance, so no fill can produce it.

The impossibility test: over every episode of the fixture and a sample of the real data,
the canonical ``respond`` renders the utterance, a fill renders exactly the same inputs
whatever the utterance is, and no reuse name a fill renders (any candidate) equals the
canonical reply's. End to end, a ``c2`` replay never serves ``respond`` from a shadow or a
join. Also: the prefix warm-up's prompt is a token prefix of the reply's, the modelled
decode lengths, and the floor's reply finding the offer's prefix cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import statistics

import pandas as pd
import pytest

from dynbranch.datasets import require_dataset, resolve_data_dir
from dynbranch.decode_lengths import RECORDED, THINK_CLOSE, decision_of
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.engines.tokenizer import count_tokens, encode
from dynbranch.errors import ConfigError, DataMissingError
from dynbranch.reuse.names import key_for, reuse_name
from dynbranch.workload import DataConfig
from tests.test_hci import FIXTURE, NO_CACHE, FillSpy, Refused, fixture_requests, run
from workloads.hci import TEMPLATE, HCIRequest, HCIWorkload, ServiceVersions, overlap_share
from workloads.hci.decode import DIALOGUE_TURN, HCI_DECODE

BLOCK = 16  # the sim profile's KV block size (prefix caching matches whole blocks)


def name_of(rendered) -> str:
    """A reuse name as C1 derives it (one model, revision and tenant for every stage)."""
    spec = TEMPLATE.stage(rendered.stage)
    key = key_for(
        spec, TEMPLATE.fingerprint(spec.name), rendered, model="m", revision="r", tenant="t"
    )
    return reuse_name(key)


def fill_renders(request: HCIRequest, point) -> list:
    """Everything the fills of every candidate of ``point`` render, in order."""
    out = []
    for candidate in point.candidates:
        spy = FillSpy(request)
        with contextlib.suppress(Refused):  # a booking: the fill ends at its mutating lookup
            asyncio.run(request.speculate(spy, point, candidate))
        out.extend(spy.rendered)
    return out


def with_utterance(request: HCIRequest, utterance: str) -> HCIRequest:
    """The same request, except for what the user said with the pick."""
    episode = dataclasses.replace(request.episode, utterance=utterance)
    return HCIRequest(
        request.request_id,
        episode,
        request.db,
        ServiceVersions(),
        0,
        decode=request.decode,
        prefix_warmup=request.prefix_warmup,
    )


def assert_no_fill_renders_the_reply(request: HCIRequest) -> int:
    """The impossibility argument for one request; returns the fill renders checked."""
    ctx, _ = run(request)
    ((point, _),) = ctx.branches
    (respond,) = (r for r in ctx.rendered if r.stage == "respond")
    assert respond.fields["utterance"] == request.episode.utterance
    assert respond.text.endswith(f"{request.episode.utterance}\n\nYour next reply:")
    fills = fill_renders(request, point)
    assert "respond" not in {r.stage for r in fills}
    assert name_of(respond) not in {name_of(r) for r in fills}
    # The fills never read the utterance: change it, and every fill input stays the same
    # while the canonical reply's name moves with it.
    other = with_utterance(request, request.episode.utterance + " And is it quiet?")
    other_ctx, _ = run(other)
    ((other_point, _),) = other_ctx.branches
    assert other_point == point  # branch-time evidence does not hold the utterance
    assert [r.input_digest for r in fill_renders(other, other_point)] == [
        r.input_digest for r in fills
    ]
    (other_respond,) = (r for r in other_ctx.rendered if r.stage == "respond")
    assert name_of(other_respond) != name_of(respond)
    return len(fills)


def test_no_fill_renders_the_reply_on_any_fixture_episode():
    requests = fixture_requests("train", prefix_warmup=True) + fixture_requests(
        "test", prefix_warmup=True
    )
    assert len(requests) == 6
    checked = sum(assert_no_fill_renders_the_reply(r) for r in requests)
    # a lookup and a warm-up per candidate; a booking's fill is refused at its lookup
    assert checked == 2 * sum(len(r.candidates) for r in requests if not r.episode.booking)
    assert checked == 26


def test_the_warmup_prompt_is_a_token_prefix_of_the_reply():
    for request in fixture_requests("train") + fixture_requests("test"):
        ctx, outcome = run(request)
        offer, respond = (r for r in ctx.rendered if r.stage in ("offer", "respond"))
        warm = TEMPLATE.stage("respond_prefix").render(
            request.prefix_values(
                request.chosen, outcome.lookup, decision_of(request.replay_text(offer))
            )
        )
        assert respond.text.startswith(offer.text) and respond.text.startswith(warm.text)
        tokens, prefix = encode(respond.text), encode(warm.text)
        assert tokens[: len(prefix)] == prefix and len(prefix) < len(tokens)


def test_the_prefix_warmup_is_an_option_off_by_default():
    request = next(r for r in fixture_requests() if not r.episode.booking)
    ctx, _ = run(request)
    ((point, _),) = ctx.branches
    renders = {}
    for warmup in (False, True):
        twin = HCIRequest(
            request.request_id,
            request.episode,
            request.db,
            ServiceVersions(),
            0,
            prefix_warmup=warmup,
        )
        spy = FillSpy(twin)
        asyncio.run(twin.speculate(spy, point, request.chosen))
        renders[warmup] = [r.stage for r in spy.rendered]
    assert renders == {False: ["lookup"], True: ["lookup", "respond_prefix"]}
    assert request.prefix_warmup is False and HCIWorkload().prefix_warmup is False
    assert HCIWorkload(root=FIXTURE, prefix_warmup=True).prefix_warmup is True
    with pytest.raises(ConfigError, match="prefix_warmup"):
        HCIWorkload(root=FIXTURE, prefix_warmup="no")


def test_turns_decode_modelled_reasoning_and_read_only_the_decision():
    assert HCI_DECODE.stages == {"offer": DIALOGUE_TURN, "respond": DIALOGUE_TURN}
    assert DIALOGUE_TURN.median_tokens == 350 and "arXiv:2508.13141" in DIALOGUE_TURN.source
    recorded = HCIWorkload(root=FIXTURE, decode_lengths="recorded")
    plain = recorded.requests(NO_CACHE, 4, 0)
    assert all(r.decode is RECORDED for r in plain)
    for modelled, request in zip(fixture_requests(), plain, strict=True):
        ctx, outcome = run(modelled)
        assert modelled.score(outcome) == 1.0
        for rendered in (r for r in ctx.rendered if r.stage != "lookup"):
            text = modelled.replay_text(rendered)
            assert THINK_CLOSE in text and text == modelled.replay_text(rendered)
            reasoning = HCI_DECODE.reasoning_tokens(rendered)
            assert 32 <= reasoning <= 4096 and count_tokens(text) > reasoning
        plain_ctx, _ = run(request)
        assert all(
            THINK_CLOSE not in request.replay_text(r)
            for r in plain_ctx.rendered
            if r.stage != "lookup"
        )


def c2_fixture_replay(tmp_path, **options) -> tuple[dict, pd.DataFrame]:
    cfg = ReplayConfig(
        workload="hci",
        arm="c2",
        backend="local",
        clock="virtual",
        requests=8,
        rate=0.5,
        seed=1,
        workers=2,
        out=tmp_path / "run",
        progress=False,
        gate="topk",
        fanout=2,
        workload_options={"root": str(FIXTURE), **options},
    )
    result = run_replay(prepare(cfg, progress=lambda _m: None))
    return result.summary, pd.read_parquet(tmp_path / "run" / "stages.parquet")


def test_c2_never_serves_the_reply_from_a_fill(tmp_path):
    summary, stages = c2_fixture_replay(tmp_path, prefix_warmup=True)
    assert (summary["completed"], summary["failed"], summary["accuracy"]) == (8, 0, 1.0)
    assert summary["unsafe_splices"] == 0 and summary["fills_issued"] > 0
    respond = stages[stages.stage == "respond"]
    assert len(respond) == 8 and set(respond.served_from) == {"exec"}
    assert not respond.speculative.any()
    spec = stages[stages.speculative]
    assert set(spec.stage) == {"lookup", "respond_prefix"}
    assert (stages[stages.stage == "lookup"].served_from == "shadow").any()  # lookups promote
    assert set(stages[stages.stage == "respond_prefix"].speculative) == {True}


def test_the_floors_reply_finds_the_offers_prompt_cached(tmp_path):
    cfg = ReplayConfig(
        workload="hci",
        backend="local",
        clock="virtual",
        requests=8,
        rate=0.5,
        seed=1,
        workers=2,
        out=tmp_path / "run",
        progress=False,
        workload_options={"root": str(FIXTURE)},
    )
    run_replay(prepare(cfg, progress=lambda _m: None))
    stages = pd.read_parquet(tmp_path / "run" / "stages.parquet").set_index(["request_id", "stage"])
    for request_id in {i for i, _ in stages.index}:
        offer, respond = stages.loc[(request_id, "offer")], stages.loc[(request_id, "respond")]
        # the offer's whole prompt blocks, on the engine that served it (the request's home)
        assert respond.engine == offer.engine
        assert respond.cached_prompt_tokens >= offer.prompt_tokens // BLOCK * BLOCK
        assert respond.cached_prompt_tokens < respond.prompt_tokens


def test_the_fillable_overlap_counts_only_what_a_fill_can_run():
    rows = [  # request, stage, start, end, speculative
        ("a", "offer", 0.0, 1.0, False),
        ("a", "pick", 1.0, 4.0, False),
        ("a", "lookup", 4.0, 4.1, False),
        ("a", "respond", 4.1, 9.0, False),
        ("b", "offer", 0.0, 1.0, False),
        ("b", "pick", 1.0, 1.5, False),
        ("b", "lookup", 1.5, 1.6, False),
        ("b", "respond", 1.6, 3.0, False),
        ("b", "lookup", 0.2, 0.3, True),  # a fill: not on the critical path
    ]
    frame = pd.DataFrame(rows, columns=["request_id", "stage", "start", "end", "speculative"])
    gross = overlap_share(frame)
    assert gross.overlap_s == pytest.approx(3.0 + 0.5)  # min(think, post-click) per request
    fill = overlap_share(frame, fillable=("lookup",), extra_s={"a": 0.05, "b": 1.0})
    assert fill.overlap_s == pytest.approx((0.1 + 0.05) + min(0.5, 0.1 + 1.0))
    assert fill.exec_s == gross.exec_s == pytest.approx(5.0 + 1.5)
    assert fill.post_click_share == pytest.approx(0.65 / 6.5)


# -- the real data set (skipped without it) ---------------------------------------------------


@pytest.fixture(scope="module")
def sgd() -> tuple[HCIWorkload, DataConfig]:
    data_dir = resolve_data_dir(None)
    try:
        require_dataset(data_dir, "sgd")
    except DataMissingError as e:
        pytest.skip(f"SGD data not available: {e}")
    return HCIWorkload(), DataConfig(data_dir, data_dir / "nonexistent-cache")


@pytest.mark.data
def test_no_fill_renders_the_reply_on_a_sample_of_real_episodes(sgd):
    _, data = sgd
    workload = HCIWorkload(prefix_warmup=True)  # the warm-up renders the most a fill can
    sample = [r for split in ("train", "test") for r in workload.requests(data, 150, 0, split)]
    asks = sum(r.episode.utterance.rstrip().endswith("?") for r in sample)
    checked = sum(assert_no_fill_renders_the_reply(r) for r in sample)
    assert len(sample) == 300 and checked > 600 and 50 < asks < 250


@pytest.mark.data
def test_real_reply_lengths_follow_the_modelled_median(sgd):
    workload, data = sgd
    requests = workload.requests(data, 400, 0, "test")
    draws = []
    for request in requests:
        ctx, _ = run(request)
        draws += [HCI_DECODE.reasoning_tokens(r) for r in ctx.rendered if r.stage == "respond"]
    assert statistics.median(draws) == pytest.approx(350, rel=0.1)


@pytest.mark.data
def test_c2_on_real_data_never_serves_the_reply_from_a_fill(sgd, tmp_path):
    cfg = ReplayConfig(
        workload="hci",
        arm="c2",
        backend="local",
        clock="virtual",
        requests=30,
        rate=0.5,
        seed=0,
        out=tmp_path / "run",
        progress=False,
        gate="topk",
        fanout=2,
    )
    result = run_replay(prepare(cfg, progress=lambda _m: None))
    s = result.summary
    assert (s["completed"], s["failed"], s["accuracy"], s["unsafe_splices"]) == (30, 0, 1.0, 0)
    stages = pd.read_parquet(tmp_path / "run" / "stages.parquet")
    respond = stages[stages.stage == "respond"]
    assert set(respond.served_from) == {"exec"} and not respond.speculative.any()
    assert s["fills_issued"] > 0
