"""The forget report's records (impl/agent/report.py, DraftsAccount in impl/agent/drafts.py):
their JSON keeps the keys, order and values stored reports and receipts have always had."""

from unsee.impl.agent.drafts import DRAFTS_ACCOUNT_KEYS, DraftsAccount, TurnCost
from unsee.impl.agent.report import JSON_KEYS, ForgetReport, ReportExtra, RestoreAccount
from unsee.impl.engines.counts import Counters
from unsee.impl.engines.speculation import DraftPolicy

TURN = TurnCost("s2/answer", 4, Counters(draft_accepted_tokens=3, draft_rejected_tokens=1, decoded_tokens=2,
                                         prefilled_tokens=5, forward_calls=3), generated=5, quotes=True)
TURN_JSON = {"block": "s2/answer", "draft": 4, "accepted": 3, "rejected": 1, "decoded": 2, "prefilled": 5,
             "fallback": False, "trusted": False, "probed": False, "generated": 5, "quotes": True, "lookups": 0,
             "looked_up": 0, "lookup_accepted": 0, "forwards": 3}
TOTALS_JSON = {"draft": 4, "accepted": 3, "rejected": 1, "decoded": 2, "prefilled": 5, "lookups": 0, "looked_up": 0,
               "lookup_accepted": 0, "forwards": 3, "turns": 1, "fallbacks": 0, "fully_accepted_turns": 0,
               "probes": 0, "quoting": 1}


def assert_same(got: dict, expected: dict) -> None:
    """Equal as dicts and in key order (the order a stored report's JSON has)."""
    assert got == expected and list(got) == list(expected)


def test_a_verified_replays_account_keeps_its_keys_and_order():
    account = DraftsAccount("verify", "verified drafts", 0.25, lookup=True)
    account = account.with_plan("calibrated: here", DraftPolicy(0.5, 2.0, "measured"), "avx2").with_turns([TURN])
    assert_same(account.to_json(), {
        "mode": "verify", "bound": 0.25, "lookup": True, "why": "verified drafts", "bound_source": "calibrated: here",
        "policy": {"per_token": 0.5, "opening": 2.0, "source": "measured"}, "cpu_isa": "avx2",
        "totals": TOTALS_JSON, "turns": [TURN_JSON]})
    assert account.totals == TOTALS_JSON and account.turns == (TURN,)


def test_an_oracle_and_an_off_account_write_only_what_they_have():
    oracle = DraftsAccount("oracle", "labels", 0.25, labelled_steps=("s3",)).with_plan(None, None, "avx512")
    assert_same(oracle.with_turns([]).to_json(), {
        "mode": "oracle", "bound": 0.25, "labelled_steps": ["s3"], "why": "labels", "bound_source": None,
        "cpu_isa": "avx512", "totals": {**dict.fromkeys(TOTALS_JSON, 0)}, "turns": []})
    # no bound measured: the bound and its source are written as None, not left out
    off = DraftsAccount("off", "no bound").with_plan(None, None, "avx2")
    assert_same(off.to_json(), {"mode": "off", "bound": None, "why": "no bound", "bound_source": None,
                                "cpu_isa": "avx2"})
    # verify with lookup off still writes it
    assert DraftsAccount("verify", "v", 1.0, lookup=False).with_plan("s", None, "x").to_json()["lookup"] is False


def test_no_replay_writes_mode_and_why_only():
    assert_same(DraftsAccount.none().to_json(), {"mode": "off", "why": "no replay of model turns from drafts"})
    assert tuple(DRAFTS_ACCOUNT_KEYS) == ("mode", "bound", "lookup", "labelled_steps", "why", "stopped",
                                          "bound_source", "policy", "cpu_isa", "totals", "turns")


def test_report_extra_keeps_the_order_it_was_written_in():
    restore = RestoreAccount(10, 1, True, 10, 0)
    extra = ReportExtra({"template": "t"}, {"divergences": [], "held": []}, {"blocks": 2}, restore)
    assert_same(extra.to_json(), {"rendering": {"template": "t"}, "divergences": [], "held": [],
                                  "engine_residue": {"blocks": 2},
                                  "restore": {"checkpoint_tokens": 10, "granularity": 1, "shared": True,
                                              "cached_tokens": 10, "recomputed_tokens": 0}})
    assert_same(ReportExtra({"template": "t"}).to_json(), {"rendering": {"template": "t"}})


def test_a_reports_json_holds_the_records_json():
    account = DraftsAccount("verify", "v", 0.25, lookup=True).with_plan("s", None, "avx2").with_turns([TURN])
    extra = ReportExtra({"template": "t"}, {"tools": {}}, None, RestoreAccount(4, 1, False, 0, 4))
    report = ForgetReport("replay", "secret", 2, 4, 1, None, 0, ("s2/answer",), 3, Counters(), 0.1, "ab", {},
                          extra=extra, drafts=account)
    out = report.to_json()
    assert list(out) == list(JSON_KEYS)
    assert_same(out["drafts"], account.to_json())
    assert_same(out["extra"], extra.to_json())
    assert out["closure"] == ["s2/answer"]
