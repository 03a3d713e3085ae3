"""The timed model's compute calibration, read from a fits file (paper/fits.json, which
`wavefront paper` writes) and chosen for a GPU preset: what `wavefront simulate` and `advise`
time launches with.

Kept beside `timed` rather than in it: the committed model cache is keyed by `timed`'s source
bytes, and reading a file changes no prediction."""
from __future__ import annotations

from wavefront.model.presets import gpu_preset, preset_for_device
from wavefront.model.timed import (
    Calibration,
    ComputeTiming,
    projected_compute,
    variant_label,
    variant_of,
)
from wavefront.schedules import Launch


def read_calibrations(path) -> dict[str, Calibration]:
    """The calibrations in a fits file (`timed_model.calibrations`), by measured GPU name."""
    from wavefront.files import read_json  # a regular file, bounded (a FIFO hung here)
    try:
        cals = read_json(path, "fits.json", limit=64 << 20,
                         nan_ok=True)["timed_model"]["calibrations"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: no timed-model calibration ({exc.__class__.__name__}: "
                         f"{exc}); run `wavefront paper` or pass --fits") from None
    try:
        return {name: Calibration.from_dict(c, f"{path}: timed_model.calibrations[{name!r}]")
                for name, c in cals.items()}
    except AttributeError:
        raise ValueError(f"{path}: timed_model.calibrations must be a mapping of GPU name to "
                         "calibration") from None


def calibration_for(preset: str, gpu, calibrations: dict[str, Calibration]):
    """launch -> ComputeTiming on GPU preset `preset` (`gpu`: its spec, overrides applied): its
    own calibration where one was measured on a GPU of that preset, else projected from the
    H100's (`timed.projected_compute`). The function raises ValueError for a variant neither
    covers."""
    own = next((c for name, c in calibrations.items()
                if preset_for_device(name) == gpu_preset(preset)), None)
    h100 = next((c for name, c in calibrations.items()
                 if preset_for_device(name) == gpu_preset("h100")), None)

    def compute(launch: Launch) -> ComputeTiming:
        timing = own.compute(launch) if own else None
        if timing is None and h100 is not None:
            timing = projected_compute(h100, gpu_preset("h100"), gpu, launch)
        if timing is None:
            raise ValueError(f"no calibration for {variant_label(variant_of(launch))} on "
                             f"{preset}")
        return timing
    return compute
