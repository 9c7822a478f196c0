"""Backend-agnostic speculative decoding: rounds & stats, verification, the n-gram proposer,
presets & the draft schedule, the NDJSON trace. No MLX, no torch, no Qt."""

from engines.speculative.ngram import NGramIndex, NGramProposer
from engines.speculative.rounds import Round, SessionStats, session_stats
from engines.speculative.schedule import MAX_STEPS, PRESETS, DraftSchedule, Preset, preset_for_steps
from engines.speculative.session import Session
from engines.speculative.trace import TraceWriter, read_trace
from engines.speculative.verify import Verdict, clip_emitted, verify_greedy, verify_sampled

__all__ = [
    "MAX_STEPS", "PRESETS", "DraftSchedule", "NGramIndex", "NGramProposer", "Preset", "Round", "Session",
    "SessionStats", "TraceWriter", "Verdict", "clip_emitted", "preset_for_steps", "read_trace",
    "session_stats", "verify_greedy", "verify_sampled",
]
