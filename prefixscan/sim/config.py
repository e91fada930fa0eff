"""Options of `prefixscan simulate` as one frozen dataclass, so a replay is fully described by its config.

The config is written into the run manifest (`simulate` section); together with the requests table and
the seed it determines every simulated table byte for byte.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from prefixscan.errors import UsageError
from prefixscan.sim.tiers import HOST_WRITES, link_gbs

KNOWLEDGE_MODES = ("exact", "delayed", "approximate")
PREFILL_MODELS = ("cost", "preble", "coeffs", "profile")
EVICTION_MODES = ("vllm", "radix")


@dataclass(frozen=True)
class ReplicaEvent:
    """A scenario event: at `time_s`, `action` ("restart" | "add" | "remove") hits `replica`.

    "add" brings up a new, cold replica (its id is the next free one and `replica` is ignored);
    "remove" stops routing to a replica and lets it drain; "restart" wipes its unpinned cache.
    """

    time_s: float
    action: str
    replica: int = -1


@dataclass(frozen=True)
class SimConfig:
    """Everything the cluster replay depends on. Times are seconds of (scaled) trace time."""

    replicas: int = 8
    policies: tuple[str, ...] = ("all",)
    # replica memory: kv_blocks wins; otherwise derived from model/gpu/dtype via prefixscan.cost
    kv_blocks: int | None = None
    unbounded_kv: bool = False
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    dtype: str = "bf16"
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.9
    eviction: str = "vllm"
    # serving time
    prefill_model: str = "cost"
    prefill_coeffs: tuple[float, ...] = ()
    # name of the hardware profile (timing.load_profile) the coeffs came from, when prefill_model="profile"
    timing_profile: str | None = None
    mfu: float = 0.5
    tpot_s: float = 0.02
    decode_slowdown: float = 0.004
    token_budget: int = 8192
    max_num_seqs: int = 256
    # run every waiting request that fits (max_num_seqs, token budget) in one prefill step, as vLLM's
    # scheduler does, instead of one prefill at a time (the fixed prefill term is then paid per step)
    batch_prefills: bool = False
    reserve_decode_blocks: bool = True
    # cache generated blocks at finish (vLLM does): the next turn of the conversation can hit its answer
    cache_generated: bool = False
    default_output_tokens: int = 128
    # router knowledge
    knowledge: str = "exact"
    event_delay_s: float = 0.0
    approx_ttl_s: float = 120.0
    # scenarios
    events: tuple[ReplicaEvent, ...] = ()
    isolate_tenants: bool = False
    rate_scale: float = 1.0
    target_rps: float | None = None
    warmup_s: float = 0.0
    seed: int = 0
    # per-policy parameter overrides: (("chwbl", "c", 1.5), ...)
    policy_params: tuple[tuple[str, str, Any], ...] = field(default_factory=tuple)
    decision_log: bool = True
    # replay every policy a second time with tenant isolation flipped and report what isolation costs
    compare_isolation: bool = False
    # Extensions: every field from `host_kv_blocks` on is left out of the manifest at its default (`to_dict`).
    # lower KV tiers (sim/tiers.py): blocks (or GiB) of host memory per replica and of a fleet-shared
    # store; 0 = none, -1 = unbounded. Links are GB/s or a name in tiers.LINKS.
    host_kv_blocks: int = 0
    host_kv_gib: float = 0.0
    host_link: str = "pcie5-x16"
    host_write: str = "through"
    shared_kv_blocks: int = 0
    shared_kv_gib: float = 0.0
    shared_read: str = "rdma-400g"
    shared_write: str = "rdma-400g"
    shared_latency_s: float = 0.001
    router_sees_tiers: bool = False
    # prefill/decode disaggregation (sim/disagg.py): `replicas` is then the prefill pool
    decode_replicas: int = 0
    decode_kv_blocks: int | None = None
    pd_link: str = "rdma-400g"
    pd_latency_s: float = 0.0005
    compare_colocated: bool = True
    # the capacity view (sim/__init__.py, `_Replays.tier_sweep`): hit rate over a grid of GPU and second-tier sizes
    tier_sweep: bool = False

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise UsageError(f"--replicas must be >= 1, got {self.replicas}")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise UsageError(f"--kv-blocks must be >= 1, got {self.kv_blocks}")
        _check_choice("--knowledge", self.knowledge, KNOWLEDGE_MODES)
        _check_choice("--prefill-model", self.prefill_model, PREFILL_MODELS)
        if self.prefill_model == "profile" and (not self.timing_profile or len(self.prefill_coeffs) != 5):
            raise UsageError("prefill model 'profile' needs timing_profile (its name) and its 5 prefill_coeffs")
        if self.prefill_model == "coeffs" and not 1 <= len(self.prefill_coeffs) <= 5:
            raise UsageError(
                "--prefill-coeffs needs 1 to 5 numbers: ms = a + b*new + c*cached + d*new*cached + e*new^2"
            )
        _check_choice("--eviction", self.eviction, EVICTION_MODES)
        if self.event_delay_s < 0 or self.approx_ttl_s <= 0:
            raise UsageError("--event-delay must be >= 0 and --approx-ttl > 0")
        if self.rate_scale <= 0 or (self.target_rps is not None and self.target_rps <= 0):
            raise UsageError("--rate-scale and --rps must be > 0")
        if self.token_budget < 2 or self.max_num_seqs < 1 or self.max_num_seqs >= self.token_budget:
            raise UsageError("need --token-budget > --max-num-seqs >= 1 (each decode uses one budget token)")
        if self.tpot_s <= 0 or self.decode_slowdown < 0 or self.default_output_tokens < 1:
            raise UsageError("--tpot must be > 0, --decode-slowdown >= 0, default output tokens >= 1")
        for ev in self.events:
            if ev.action not in ("restart", "add", "remove"):
                raise UsageError(f"unknown replica event {ev.action!r}; use restart, add or remove")
            if ev.action != "add" and not 0 <= ev.replica < self.replicas + len(self.events):
                raise UsageError(f"replica event {ev.action} names replica {ev.replica}, which never exists")

        self._check_tiers()

    def _check_tiers(self) -> None:
        if self.host_kv_blocks < -1 or self.shared_kv_blocks < -1 or self.host_kv_gib < 0 or self.shared_kv_gib < 0:
            raise UsageError("host and shared KV sizes must be >= 0 (blocks may be -1: unbounded)")
        _check_choice("--host-write", self.host_write, HOST_WRITES)
        for v in (self.host_link, self.shared_read, self.shared_write, self.pd_link):
            link_gbs(v)
        if self.shared_latency_s < 0 or self.pd_latency_s < 0:
            raise UsageError("--shared-latency-ms and --pd-latency-ms must be >= 0")
        if self.decode_replicas < 0 or (self.decode_kv_blocks is not None and self.decode_kv_blocks < 2):
            raise UsageError("--decode-replicas must be >= 0 and --decode-kv-blocks >= 2")
        if self.router_sees_tiers and not self.tiered:
            raise UsageError("--router-sees-tiers needs a lower tier (--host-kv-* or --shared-kv-*)")
        if self.router_sees_tiers and (self.knowledge == "approximate" or self.event_delay_s > 0):
            raise UsageError("--router-sees-tiers reads exact KV events (with tiers): use --knowledge exact")

    @property
    def tiered(self) -> bool:
        """Any KV tier below the GPU configured."""
        return bool(self.host_kv_blocks or self.host_kv_gib or self.shared_kv_blocks or self.shared_kv_gib)

    @property
    def slots(self) -> int:
        """Replica ids a replay needs: the fleet's and one per "add" event."""
        return self.replicas + sum(1 for e in self.events if e.action == "add")

    @property
    def disaggregated(self) -> bool:
        return self.decode_replicas > 0

    @classmethod
    def from_options(cls, **options: Any) -> SimConfig:
        """A config from options as `prefixscan simulate` and `prefixscan.simulate()` take them (SimConfig
        fields; None = not given), with the defaults that follow from other options, in this one place:
        knowledge is "delayed" when event_delay_s > 0, else "exact"; prefill_coeffs turn the "cost" prefill
        model into "coeffs"; timing_profile (a built-in name or a JSON file, never with prefill_coeffs) gives
        prefill model "profile", the profile's coefficients and, unless given, its tpot_s and decode_slowdown.
        """
        o = {k: v for k, v in options.items() if v is not None}
        o.setdefault("knowledge", "delayed" if o.get("event_delay_s", 0.0) > 0 else "exact")
        if o.get("timing_profile"):
            if o.get("prefill_coeffs"):
                raise UsageError("give --timing-profile or --prefill-coeffs, not both")
            from prefixscan.sim.timing import profile_options

            prof = profile_options(o["timing_profile"])
            o.update({k: v for k, v in prof.items() if k not in ("tpot_s", "decode_slowdown") or k not in o})
        elif o.get("prefill_model") == "profile":
            raise UsageError("--prefill-model profile needs --timing-profile FILE|NAME")
        elif o.get("prefill_coeffs") and o.get("prefill_model", "cost") == "cost":
            o["prefill_model"] = "coeffs"
        return cls(**o)

    def params_for(self, policy: str) -> dict[str, Any]:
        """The overrides given for one policy (`--param chwbl.c=1.5`)."""
        return {k: v for p, k, v in self.policy_params if p == policy}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the manifest."""
        d = asdict(self)
        for k, v in _EXTENSION_DEFAULTS.items():  # keep manifests of plain replays unchanged
            if d[k] == v:
                del d[k]
        d["events"] = [asdict(e) for e in self.events]
        d["policy_params"] = [list(p) for p in self.policy_params]
        return d


def _check_choice(option: str, value: str, allowed: tuple[str, ...]) -> None:
    """A value outside an option's choices is a usage error, worded the same for every such option."""
    if value not in allowed:
        raise UsageError(f"{option} must be one of {', '.join(allowed)}, got {value!r}")


_FIELDS = fields(SimConfig)
_EXTENSION_DEFAULTS = {f.name: f.default for f in _FIELDS[[f.name for f in _FIELDS].index("host_kv_blocks") :]}
