"""The multi-turn prefix cache benchmark (luce.benchmark.prefix_cache) on a tiny dense model:
chat prompts grow by the previous output and a new message, agent prompts also rewrite the
middle; the cache-on run sees the cache-off prompts, gives the same outputs and takes tokens
from the cache from turn 2 on (agent: only up to the edit)."""
from luce.benchmark.prefix_cache import Conversation, Workload, format_table, run_luce, summarize
from luce.models import load_model
from luce.testing.tiny_models import make_dense


def test_conversation_grows_and_agent_edits_the_middle():
    chat = Conversation(Workload("chat", turns=3, first=50, grow=20, gen=4, token_low=1, token_high=300))
    p1 = chat.next_prompt(None)
    p2 = chat.next_prompt([7, 7, 7, 7])
    assert len(p1) == 50 and p2[:54] == p1 + [7, 7, 7, 7] and len(p2) == 74
    agent = Conversation(Workload("agent", turns=3, first=50, grow=20, gen=4, edit=6, token_low=1, token_high=300))
    a1 = agent.next_prompt(None)
    a2 = agent.next_prompt([7, 7, 7, 7])
    assert a2[:27] == a1[:27] and a2[27:33] != a1[27:33] and len(a2) == 74


def test_cache_on_run_matches_cache_off_and_serves_tokens(tmp_path):
    path = tmp_path / "d.gguf"
    make_dense(path, arch="qwen3", seed=2)
    model = load_model(path, "cpu")
    for kind in ("chat", "agent"):
        w = Workload(kind, turns=3, first=100, grow=40, gen=4, edit=8, token_low=1, token_high=300)
        off = run_luce(model, w, cache=False)
        on = run_luce(model, w, cache=True, prompts=[t["prompt"] for t in off["turns"]])
        s = summarize(off, on)
        assert s["outputs_identical"] and len(s["rows"]) == 3
        cached = [r["cached_tokens"] for r in s["rows"]]
        assert cached[0] == 0 and all(c > 0 for c in cached[1:])
        if kind == "agent":   # the edit sits in the middle of the history: nothing past it is served
            assert all(c <= len(p["prompt"]) // 2 + 8 for c, p in zip(cached[1:], off["turns"][:-1]))
        assert f"luce {kind}" in format_table(f"luce {kind}", s)
