"""The public call: look up (or make) the Plan for these arrays and options, and run it.

`wavefront.attention` comes here: `attention_plain` for the call a model makes (the mask
alone), `attention_with` for a call with options (`plan.CallOptions`, as its `values()`).
Plans are kept in a bounded cache keyed by everything a launch depends on (the arrays' shapes,
strides, dtype and device, and the options), so a repeated call costs a dictionary look-up and
the launch (`AttentionLauncher.launch_call` / `launch_plain`). `plan_for` hands the cached Plan
to a caller who holds it (`wavefront.plan`, the torch op). Packed batches' launchers are cached
here too, apart (`wavefront.kernel.varlen`).
"""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict

from wavefront.device import current_device
from wavefront.kernel import carry_over
from wavefront.kernel.arrays import (_ArrayView, _call_key, _check_inputs, _cupy_key, _empty,
                                     _torch_device)
from wavefront.kernel.launcher import AttentionLauncher
from wavefront.kernel.plan import PLAIN_OPTIONS, CallOptions, Plan, chosen_config
from wavefront.kernel.streams import (_as_current_stream, _in_graphs, _waited_on_in_graphs,
                                      current_stream)
from wavefront.kernel.tuning import _carry_over_choices

# Plans kept by the public call: a Plan's launcher holds its binary, its work table on the GPU
# and its workspace, so it is worth keeping for the shapes a model calls step after step, and
# bounded so that a sweep over many shapes does not keep every table alive.
LAUNCHER_CACHE_SIZE = 64
_plans: OrderedDict = OrderedDict()
_launchers_lock = threading.Lock()
# Packed batches are kept apart: a training or serving loop brings new lengths every call, and
# in one cache with the dense shapes a model calls every step they would push those out and
# keep dozens of stale work tables on the GPU.
VARLEN_LAUNCHER_CACHE_SIZE = 16
_varlen_launchers: OrderedDict = OrderedDict()
# Per packed problem (arrays, options, number of sequences; not the lengths): the first
# launcher built, whose binary, stand-ins and bound arguments a batch of new lengths reuses
# (`AttentionLauncher.for_lengths`). As bounded as the launchers.
_varlen_templates: OrderedDict = OrderedDict()
# A plain call's key (`attention_plain`: q, k, v and the mask) -> its Plan, which the cache
# holds under the full key; emptied whenever that cache lets one go.
_plain_plans: dict = {}
# The options' values of a call that names only the mask, by mask: its key's options.
PLAIN_VALUES = {causal: options.values() for causal, options in PLAIN_OPTIONS.items()}


def attention_with(q, k, v, values: tuple, out=None, stream=None):
    """The public call with options: `values` are a `CallOptions`' values in field order
    (`CallOptions.values()`, `plan.CALL_OPTIONS`; `wavefront.api.attention` builds them from
    its keywords). Its hot path: one key, one dictionary read, the launch. The options become
    a `CallOptions` (checked) only when a Plan is made."""
    key, plan = _cached(_call_key(q, k, v, values))
    if plan is None:
        plan, q, k, v = _made_plan(q, k, v, key, values, stream)
    else:
        plan.recently_used = True  # a hit (`_keep`)
    return plan.launcher.launch_call(q, k, v, out, stream)


def attention_plain(q, k, v, causal):
    """`attention_with` for the call that names no option but the mask, the call a model makes
    (`wavefront.attention(q, k, v, causal=...)`). On torch tensors or CuPy arrays with a bool
    mask it keys by the arrays and the mask alone: building the full key's options tuple and
    their types (which tell True from 1), and passing them, cost 1.7-2.0 us a call on the H100
    hosts (data/public_call/RUNS.md.gz#a99b7fd). A miss takes the full path and remembers the
    Plan that path cached."""
    kind = type(q)
    if type(k) is not kind or type(v) is not kind or type(causal) is not bool:
        key = None
    elif kind.__module__ == "torch":
        key = (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype,
               k.get_device(), v.shape, v.stride(), v.dtype, v.get_device(), causal)
    elif kind.__module__.startswith("cupy"):
        key = (_cupy_key(q), _cupy_key(k), _cupy_key(v), causal)
    else:
        key = None
    if key is None:  # mixed or other arrays, or a mask that is not a bool: the full key
        return attention_with(q, k, v, (causal, *PLAIN_VALUES[False][1:]))
    plan = _plain_plans.get(key)
    if plan is not None:
        plan.recently_used = True  # a hit (`_keep`)
        launcher = plan.launcher
        if launcher.plain_ready:
            return launcher.launch_plain(q, k, v)
        return launcher.launch_call(q, k, v, None, None)
    values = PLAIN_VALUES[causal]
    out = attention_with(q, k, v, values)
    _, cached = _cached(_call_key(q, k, v, values))
    if cached is not None:
        _plain_plans[key] = cached
    return out


def plan_for(q, k, v, options: CallOptions, stream=None) -> Plan:
    """The Plan the public call runs for these arrays and options: the cached one, else made
    (and cached). `stream`: where a measured carry-over would time its candidates."""
    key, plan = _cached(_call_key(q, k, v, options.values()))
    if plan is None:
        plan = _made_plan(q, k, v, key, options, stream)[0]
    return plan


def _made_plan(q, k, v, key, options, stream) -> tuple:
    """A miss: -> (the Plan for q, k, v and `options` (a `CallOptions` or its values) made
    and cached under `key`, q, k, v as the launch takes them). Arrays with no key (DLPack
    arrays that need converting, an option that cannot be hashed) are converted, checked and
    planned for this call alone."""
    if not isinstance(options, CallOptions):
        options = CallOptions(*options)
    if key is None:
        vq, (q, k, v) = _check_inputs(q, k, v)
        return _new_plan(vq, q, k, v, options, stream), q, k, v
    return _cached_or_built(key, lambda: _new_plan(_check_inputs(q, k, v)[0], q, k, v,
                                                   options, stream)), q, k, v


def _new_plan(vq: _ArrayView, q, k, v, options: CallOptions, stream=None) -> Plan:
    """A Plan for q (described by `vq`), k, v and `options`, on the current GPU: the
    configuration chosen (`plan.chosen_config`: the caller's, the tuned table's, a measured
    carry-over's), the launcher bound."""
    measure = _measurer(q, k, v, vq, options, stream)
    config, source = chosen_config(options, vq.shape, k.shape, measure)
    launcher = AttentionLauncher.planned(vq, tuple(k.shape), **options.launcher_options(),
                                         **config)
    return Plan(launcher.launch, config, source, options, current_device(), vq.dtype,
                tuple(k.shape), launcher, _call_key(q, k, v, ()))


def _measurer(q, k, v, vq: _ArrayView, options: CallOptions, stream=None):
    """`measure` for `tuning.resolve_config`: the candidates' launchers made with the call's
    own options and timed on its arrays, on its stream (`carry_over.choose`)."""
    def measure(configs):
        with (contextlib.nullcontext() if stream is None else _as_current_stream(vq, stream)):
            return carry_over.choose(
                configs, lambda config: AttentionLauncher.planned(
                    vq, tuple(k.shape), **options.launcher_options(), **config),
                q, k, v, current_stream(vq.library, _torch_device(vq.device)
                                        if vq.library == "torch" else None),
                (lambda: _empty(vq, vq.shape[:3], "float32")) if options.return_lse else None)
    return measure


def measure_carry_over(q, k, v, *, causal: bool = False):
    """Time the measured carry-over's candidates for this problem now (a bench does, before
    its rounds), as the first plain call would under `WAVEFRONT_CARRY_OVER=measure`.
    -> the CarryOverChoice, or None where there is nothing to choose (an entry of this very
    shape, one distinct configuration, no entry, another carry-over mode)."""
    vq, (q, k, v) = _check_inputs(q, k, v)
    dev = current_device()
    options = PLAIN_OPTIONS[causal]
    chosen_config(options, vq.shape, k.shape, _measurer(q, k, v, vq, options))
    return _carry_over_choices.get((dev.name, tuple(vq.shape), tuple(k.shape), causal))


def release_graph_launchers() -> int:
    """Let go of the launchers the public call launched into CUDA-graph captures, which it
    otherwise keeps for good (`_in_graphs`: no one tells it when a graph is destroyed, and a
    graph replays on its launchers' buffers for as long as it lives), and of the table events
    such graphs wait on. Call it only once every graph that captured a wavefront call is
    destroyed (a server that re-captures for new shapes, say). Launchers still in the cache
    stay there; the others' buffers go once their queued launches are done. -> how many
    launchers were held."""
    with _launchers_lock:
        held = len(_in_graphs)
        _in_graphs.clear()
        _waited_on_in_graphs.clear()
    return held


def clear_launcher_cache() -> None:
    """Forget every cached Plan and launcher (after `wavefront tune --write`, say: cached calls
    keep the configuration they were made with)."""
    with _launchers_lock:
        _plans.clear()
        _plain_plans.clear()
        _varlen_launchers.clear()
        _varlen_templates.clear()
        _carry_over_choices.clear()  # chosen from the table of then


def _cached(key, cache=_plans):
    """-> (key, the entry cached under it or None); the key becomes None where it cannot be
    hashed (a list of tiles, say: no caching, same result). The hash is taken once, by the
    look-up itself: hashing a key of shapes and dtypes costs about a microsecond."""
    try:
        return key, cache.get(key)
    except TypeError:
        return None, None


def _cached_or_built(key, build, varlen: bool = False):
    """The entry (a Plan; a launcher for packed batches) cached under `key` (None: not
    cacheable), marked used, else `build()`, then cached (packed batches in a cache of their
    own).

    A hit is one dictionary read (atomic under the interpreter lock, so no lock of ours on
    the hot path) and the mark; inserting and evicting take the lock (`_keep`)."""
    cache, size = ((_varlen_launchers, VARLEN_LAUNCHER_CACHE_SIZE) if varlen else
                   (_plans, LAUNCHER_CACHE_SIZE))
    key, found = _cached(key, cache)
    if found is not None:
        found.recently_used = True
        return found
    return _keep(cache, key, build(), size)


def _keep(cache: OrderedDict, key, entry, size: int):
    """Cache `entry` (a Plan or a launcher) under `key` (None: not cacheable); -> the entry
    cached under `key` (a racing thread's build wins).

    Past `size` entries, the oldest goes unless it was used since it last came up, which
    sends it to the back unmarked (a second chance: least-recently-used, near enough); the
    entry just kept is passed over once. A launcher a model calls every step so outlives any
    number of one-off shapes (a sweep, a server's new prompt lengths, host-lengths packed
    batches), where oldest-first would evict it and rebuild it on its next call (about a
    millisecond of host time). Exact LRU would cost every hit the lock and a second hash of
    its key, about a microsecond: more than the mark, one attribute written. A new entry
    starts unmarked: marked, one-offs would look used, and clearing them all would bring the
    model's launcher round unmarked."""
    if key is not None:
        with _launchers_lock:
            kept = cache.setdefault(key, entry)
            if kept is not entry:
                return kept
            entry.recently_used = False
            passed_over = False
            while len(cache) > size:
                oldest_key, oldest = next(iter(cache.items()))
                if oldest.recently_used or (oldest is entry and not passed_over):
                    passed_over = passed_over or oldest is entry
                    oldest.recently_used = False
                    cache.move_to_end(oldest_key)
                else:
                    del cache[oldest_key]
                    _plain_plans.clear()  # it may hold the Plan let go
    return entry
