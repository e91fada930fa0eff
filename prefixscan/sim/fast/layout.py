"""Row, column and slot indices of the few arrays the compiled replay passes between its kernels.

The reference engine keeps per-replica counters in a `ClusterView` of named numpy arrays and per-request
results in separate arrays; the compiled path keeps them as rows/columns of a handful of matrices so each
kernel call carries few arrays (every array argument costs numba a reference-count update).
"""

from __future__ import annotations

# ci: int64 [N_CI, slots] per-replica counters and scratch rows
INFLIGHT, WAITING, DECODING, LOAD_BLOCKS, INFL_OUT, KV_AVAIL, QUEUED_BLOCKS = 0, 1, 2, 3, 4, 5, 6
ACTIVE, RUNNING, LANE_BUSY, WQ_HEAD, WQ_TAIL = 7, 8, 9, 10, 11
ACT = 12  # the active replica ids in ascending order (first G_NACT entries)
VCOUNT, REC_HEAD, REC_TAIL = 13, 14, 15  # approximate view: blocks known, routing-record FIFO
EXACT, KB, CACHEDV = 16, 17, 18  # this request: exact matched blocks, known matched blocks, cached tokens
SCR0, SCR1 = 19, 20  # policy scratch
N_CI = 21
# cf: float64 [N_CF, slots]
QUEUED_PREFILL, LANE_UNTIL, LAST_T, AREA_OUT, AREA_WAIT, PREV_T = 0, 1, 2, 3, 4, 5
FSCR0, FSCR1 = 6, 7  # policy scratch
N_CF = 8
# g: int64 globals
G_NACT, G_VERSION, G_UPTR, G_HEAP, G_COUNTER, G_NEXT_ADD = 0, 1, 2, 3, 4, 5
G_CAPACITY, G_BLOCK, G_MAX_SEQS, G_GEN_ON, G_VMODE = 6, 7, 8, 9, 10
G_IT_HEAD, G_IT_TAIL, G_ID_HEAD, G_ID_TAIL = 11, 12, 13, 14  # delayed view FIFOs
G_BATCH = 15  # batch_prefills: a prefill step admits every queue head that fits
N_G = 16
# fp: float64 model parameters: serving model, then knowledge view (VP_NEXT_SWEEP is state)
SV_A, SV_B, SV_C, SV_D, SV_E, SV_TPOT, SV_SLOW, SV_BUDGET = 0, 1, 2, 3, 4, 5, 6, 7
VP_DELAY, VP_TTL, VP_MAX_BLOCKS, VP_HAS_SWEEP, VP_SWEEP, VP_NEXT_SWEEP = 8, 9, 10, 11, 12, 13
N_FP = 14
# rq: int64 [n, N_RQ] per-request inputs, queue links and results
RQ_NB, RQ_PIN, RQ_EXTRA, RQ_PROMPT, RQ_OUT, RQ_CAP, RQ_NXT, RQ_WQ_NEXT, RQ_REC_NEXT = 0, 1, 2, 3, 4, 5, 6, 7, 8
RQ_REPLICA, RQ_CACHED, RQ_BEST, RQ_ROUTED, RQ_ROUTED_K, RQ_REASON, RQ_PREDICTED, RQ_CAND_N = (
    9, 10, 11, 12, 13, 14, 15, 16
)
RQ_TOFF, RQ_MAXHIT = 17, 18  # where the request's block table starts in `tbl`; most blocks its lookup may hit
N_RQ = 19
# rf: float64 [n, N_RF]
RF_ARRIVAL, RF_START, RF_FIRST, RF_FINISH, RF_PRE_S, RF_PRED_S, RF_REC_NOW, RF_REC_T = 0, 1, 2, 3, 4, 5, 6, 7
N_RF = 8
# knowledge view modes
V_EXACT, V_DELAYED, V_APPROX = 0, 1, 2
# event kinds of both engines (at equal times completions free resources before later work)
DECODE_DONE, PREFILL_DONE = 0, 1
# scenario actions
EV_RESTART, EV_ADD, EV_REMOVE = 0, 1, 2
