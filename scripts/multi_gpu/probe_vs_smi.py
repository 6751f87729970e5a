"""Step 2 of scripts/device-multi-gpu: the probe on every GPU against nvidia-smi, and one refused field.

    python scripts/multi_gpu/probe_vs_smi.py --out DIR

1. One real probe frame (`python -m opsconsole.probe --once`) while nvidia-smi --query-gpu is read
   every 0.2 s; the nvidia-smi reading nearest the frame's time (within the same second) is compared
   with it field by field (TOLERANCES), per GPU. Files: probe_frame.json, smi.csv, compare.json.
2. A field the driver refuses on one GPU: the real pynvml with nvmlDeviceGetPowerUsage answering
   NVML_ERROR_NO_PERMISSION for the last GPU only (FieldRefusingNvml: no LD_PRELOAD, nothing changed
   on the GPU). The probe's reader must show that GPU's power as missing with the error named, and
   every other field of it, and every other GPU, as a clean read shows them. File: refused_field.json.
Exit 0 when both hold, 1 when not.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SMI_FIELDS = (
    "index",
    "name",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "clocks.sm",
)
SMI_QUERY = ["nvidia-smi", "--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits"]
MIB = 1 << 20
# nvidia-smi field -> (probe field, probe value -> smi unit, allowed difference: (absolute, relative)).
# Readings taken up to a second apart: utilization and power move, clocks step, memory shifts by
# the driver's own allocations; temperature moves a degree; the rest is exact.
TOLERANCES = {
    "index": ("index", None, (0, 0.0)),
    "name": ("name", None, None),
    "utilization.gpu": ("utilization_gpu", None, (10, 0.0)),
    "memory.used": ("memory_used", lambda v: v / MIB, (64, 0.01)),
    "memory.total": ("memory_total", lambda v: v / MIB, (1, 0.0)),
    "temperature.gpu": ("temperature", None, (2, 0.0)),
    "power.draw": ("power_draw_w", None, (10, 0.10)),
    "clocks.sm": ("clock_sm_mhz", None, (100, 0.10)),
}
SAME_SECOND_S = 1.0


def smi_rows(text):
    """nvidia-smi's CSV lines as {field: text} per GPU."""
    rows = []
    for line in text.strip().splitlines():
        values = [value.strip() for value in line.split(",")]
        if len(values) == len(SMI_FIELDS):
            rows.append(dict(zip(SMI_FIELDS, values)))
    return rows


def compare(gpus, rows):
    """Per GPU, each field: probe value (in nvidia-smi's unit), nvidia-smi's, and whether they agree."""
    by_index = {int(row["index"]): row for row in rows if row["index"].isdigit()}
    report = []
    for gpu in gpus:
        row = by_index.get(gpu.get("index"))
        fields = {}
        for smi_name, (probe_name, convert, tolerance) in TOLERANCES.items():
            theirs_text = None if row is None else row[smi_name]
            ours = gpu.get(probe_name)
            if ours is not None and convert is not None:
                ours = convert(ours)
            if tolerance is None:
                agree = ours is not None and ours == theirs_text
                fields[smi_name] = {"probe": ours, "smi": theirs_text, "agree": agree}
                continue
            try:
                theirs = float(theirs_text)
            except (TypeError, ValueError):  # "[N/A]", "[Not Supported]", no row
                theirs = None
            if ours is None or theirs is None:
                agree = ours is None and theirs is None
                limit = None
            else:
                limit = max(tolerance[0], tolerance[1] * abs(theirs))
                agree = abs(float(ours) - theirs) <= limit
            fields[smi_name] = {
                "probe": None if ours is None else round(float(ours), 1),
                "smi": theirs,
                "allowed": limit,
                "agree": agree,
            }
        report.append({"gpu": gpu.get("index"), "fields": fields, "agree": all(f["agree"] for f in fields.values())})
    return report


class FieldRefusingNvml(object):
    """pynvml as it is, except that `function` raises NVMLError(code) for the GPU of NVML index `gpu`.

    Handles are told apart by the index they were opened with (nvmlDeviceGetHandleByIndex), so the
    wrapper needs nothing from the driver beyond what the probe itself calls.
    """

    def __init__(self, nvml, gpu, function, code):
        self._nvml, self._gpu, self._function, self._code = nvml, gpu, function, code
        self._index_of = {}
        self.refusals = 0

    def __getattr__(self, name):
        real = getattr(self._nvml, name)
        if name == "nvmlDeviceGetHandleByIndex":

            def opened(index, *args):
                handle = real(index, *args)
                self._index_of[id(handle)] = (handle, index)
                return handle

            return opened
        if name == self._function:

            def refused(handle, *args, **kwargs):
                if self._index_of.get(id(handle), (None, None))[1] == self._gpu:
                    self.refusals += 1
                    raise self._nvml.NVMLError(self._code)
                return real(handle, *args, **kwargs)

            return refused
        return real


def presence(sample):
    """Which of a reading's fast fields hold a value (a refused field must not take others with it)."""
    names = (
        "utilization_gpu",
        "memory_used",
        "memory_total",
        "temperature",
        "power_draw_w",
        "clock_sm_mhz",
        "clock_mem_mhz",
        "pstate",
    )
    return {name: getattr(sample, name) is not None for name in names}


def isolate_refused_field(
    nvml, gpu=None, function="nvmlDeviceGetPowerUsage", field="power_draw", attribute="power_draw_w"
):
    """Read every GPU cleanly, then with `function` refused (NVML_ERROR_NO_PERMISSION) on GPU `gpu`
    (default: the last); whether only that GPU's `attribute` went missing, with its error named."""
    from opsconsole.probe.gpu import GpuReader

    def read(module):
        reader = GpuReader(slow_every=1, nvml=module)
        try:
            return reader.read()
        finally:
            reader.close()

    clean = read(nvml)
    indices = [sample.index for sample in clean.gpus]
    if gpu is None:
        gpu = indices[-1] if indices else 0
    refusing = FieldRefusingNvml(nvml, gpu, function, nvml.NVML_ERROR_NO_PERMISSION)
    faulty = read(refusing)
    per_gpu = []
    for before, after in zip(clean.gpus, faulty.gpus):
        expected = presence(before)
        if after.index == gpu:
            expected[attribute] = False
        named = [error for error in after.errors if error.startswith(field + ":")]
        same_other_fields = presence(after) == expected
        isolated = same_other_fields and (bool(named) if after.index == gpu else not named)
        per_gpu.append(
            {
                "gpu": after.index,
                "refused_here": after.index == gpu,
                attribute: getattr(after, attribute),
                "clean_" + attribute: getattr(before, attribute),
                "errors": list(after.errors),
                "fields_present": presence(after),
                "as_expected": isolated,
            }
        )
    return {
        "function": function,
        "code": "NVML_ERROR_NO_PERMISSION",
        "refused_gpu": gpu,
        "refusals": refusing.refusals,
        "source": faulty.source,
        "gpus": per_gpu,
        "ok": faulty.source == "nvml"
        and refusing.refusals > 0
        and bool(per_gpu)
        and all(g["as_expected"] for g in per_gpu),
    }


def frame_beside_smi(python, out):
    """One probe frame and the nvidia-smi reading nearest its time: (frame, smi text, seconds apart)."""
    readings = []
    done = threading.Event()

    def poll_smi():
        while not done.is_set():
            before = time.time()
            try:
                text = subprocess.run(
                    SMI_QUERY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30
                ).stdout.decode()
            except (OSError, subprocess.SubprocessError):
                return
            readings.append(((before + time.time()) / 2, text))
            done.wait(0.2)

    poller = threading.Thread(target=poll_smi, daemon=True)
    poller.start()
    try:
        probe = subprocess.run(
            [python, "-m", "opsconsole.probe", "--once"], cwd=ROOT, stdout=subprocess.PIPE, timeout=120
        )
        time.sleep(0.3)  # one more nvidia-smi reading after the frame
    finally:
        done.set()
        poller.join(timeout=30)
    with open(os.path.join(out, "probe_frame.json"), "wb") as handle:
        handle.write(probe.stdout)
    frame = json.loads(probe.stdout.decode())
    if not readings:
        raise SystemExit("no nvidia-smi reading came (is nvidia-smi on the PATH?)")
    at, text = min(readings, key=lambda reading: abs(reading[0] - frame.get("time", 0)))
    with open(os.path.join(out, "smi.csv"), "w") as handle:
        handle.write(text)
    return frame, text, at - frame.get("time", 0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    frame, text, apart = frame_beside_smi(args.python, args.out)
    gpus = frame.get("gpus") or []
    rows = smi_rows(text)
    fields = compare(gpus, rows)
    compared = {
        "gpu_source": frame.get("gpu_source"),
        "gpus_probe": len(gpus),
        "gpus_smi": len(rows),
        "seconds_apart": round(apart, 3),
        "tolerances": {k: v[2] for k, v in TOLERANCES.items()},
        "per_gpu": fields,
    }
    compared["ok"] = (
        frame.get("gpu_source") == "nvml"
        and len(gpus) == len(rows) > 0
        and abs(apart) <= SAME_SECOND_S
        and all(g["agree"] for g in fields)
    )
    with open(os.path.join(args.out, "compare.json"), "w") as handle:
        json.dump(compared, handle, indent=1)
    print(
        "probe frame vs nvidia-smi %+.2f s apart: %d GPU(s) by the probe, %d by nvidia-smi"
        % (apart, len(gpus), len(rows))
    )
    for gpu in fields:
        print(
            " gpu %s: %s"
            % (
                gpu["gpu"],
                ", ".join(
                    "%s %s/%s%s" % (name, f["probe"], f["smi"], "" if f["agree"] else " DIFFERS")
                    for name, f in gpu["fields"].items()
                    if name not in ("index", "name")
                ),
            )
        )
    import pynvml

    refused = isolate_refused_field(pynvml)
    with open(os.path.join(args.out, "refused_field.json"), "w") as handle:
        json.dump(refused, handle, indent=1)
    for gpu in refused["gpus"]:
        print(
            " refused %s on gpu %s: gpu %s power %s, errors %s -> %s"
            % (
                refused["function"],
                refused["refused_gpu"],
                gpu["gpu"],
                gpu["power_draw_w"],
                gpu["errors"],
                "as expected" if gpu["as_expected"] else "NOT as expected",
            )
        )
    if len(refused["gpus"]) < 2:
        print(
            " a failing field isolated to one GPU among several: skipped: needs 2 GPUs (found %d); the refused field was read on the one GPU"
            % len(refused["gpus"])
        )
    print(
        "step 2: fields %s, refused field %s"
        % ("agree" if compared["ok"] else "DIFFER", "isolated" if refused["ok"] else "NOT isolated")
    )
    return 0 if compared["ok"] and refused["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
