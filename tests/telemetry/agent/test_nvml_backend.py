from types import SimpleNamespace

import pynvml
import pytest

from telemetry.agent.errors import BackendUnavailable
from telemetry.agent.mapping import AllocationMapper
from telemetry.agent.nvml_backend import NvmlBackend
from telemetry.agent.slurm_mapping import SlurmAllocations

MIB = 1024 * 1024
SLEEPER = "import time\nwhile True: time.sleep(0.05)"


class FakeDevice:
    """One GPU as NVML would describe it, with the structures the real calls return."""

    def __init__(self, *, index: int, pids: list[int], energy: bool = True) -> None:
        self.index = index
        self.uuid = f"GPU-0000000{index}-fake"
        self.pids = pids
        self.energy = energy
        self.energy_mj = 5_000_000


@pytest.fixture
def fake_nvml(monkeypatch):
    devices: list[FakeDevice] = []
    calls: list[str] = []

    def handle(index):
        return devices[index]

    def not_supported():
        return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def energy(device):
        if not device.energy:
            raise not_supported()
        return device.energy_mj

    def processes(device):
        return [
            pynvml.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": 3000 * MIB})
            for pid in device.pids
        ]

    fakes = {
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetUUID": lambda d: d.uuid,
        "nvmlDeviceGetName": lambda d: "NVIDIA A100-SXM4-80GB",
        "nvmlDeviceGetUtilizationRates": lambda d: pynvml.c_nvmlUtilization_t(gpu=87, memory=40),
        "nvmlDeviceGetMemoryInfo": lambda d, version=None: pynvml.c_nvmlMemory_t(
            total=81920 * MIB, free=71920 * MIB, used=10000 * MIB
        ),
        "nvmlDeviceGetPowerUsage": lambda d: 312_500,
        "nvmlDeviceGetTemperature": lambda d, sensor: (
            61 if sensor == pynvml.NVML_TEMPERATURE_GPU else -1
        ),
        "nvmlDeviceGetTotalEnergyConsumption": energy,
        "nvmlDeviceGetComputeRunningProcesses": processes,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)
    return SimpleNamespace(devices=devices, calls=calls)


def test_nvml_backend_converts_units_and_maps_processes(fake_nvml, children):
    job = children.python(SLEEPER, env={"GPUMARKET_ALLOCATION": "17", "SLURM_JOB_ID": "4242"})
    fake_nvml.devices.append(FakeDevice(index=0, pids=[job.pid]))
    fake_nvml.devices.append(FakeDevice(index=1, pids=[]))

    backend = NvmlBackend()
    gpus = backend.gpus()
    samples = backend.sample()

    assert backend.name == "nvml"
    assert [(g.uuid, g.index, g.memory_total_mib) for g in gpus] == [
        ("GPU-00000000-fake", 0, 81920),
        ("GPU-00000001-fake", 1, 81920),
    ]
    assert gpus[0].name == "NVIDIA A100-SXM4-80GB"
    first = samples[0]
    assert first.gpu == "GPU-00000000-fake"
    assert first.utilization_pct == 87
    assert first.memory_used_mib == 10000
    assert first.memory_total_mib == 81920
    assert first.power_w == pytest.approx(312.5)  # from milliwatts
    assert first.temperature_c == 61.0
    assert first.energy_j == pytest.approx(5000.0)  # from millijoules
    assert first.at.tzinfo is not None
    [process] = first.processes
    assert process.pid == job.pid
    assert process.memory_mib == 3000
    assert process.allocation == 17
    assert process.slurm_job == "4242"
    assert process.state == "running"
    assert samples[1].processes == ()


def test_nvml_backend_maps_an_untagged_slurm_job_through_its_comment(fake_nvml, children, scontrol):
    scontrol.job("4242", comment="gpumarket:allocation=17")
    job = children.python(SLEEPER, env={"SLURM_JOB_ID": "4242"})
    fake_nvml.devices.append(FakeDevice(index=0, pids=[job.pid]))

    backend = NvmlBackend(mapper=AllocationMapper(sources=(SlurmAllocations(),)))
    [sample] = backend.sample()

    [process] = sample.processes
    assert (process.pid, process.allocation, process.slurm_job) == (job.pid, 17, "4242")


def test_nvml_backend_reports_a_vanished_process_unmapped(fake_nvml, children):
    gone = children.python("pass")
    gone.wait(timeout=5)
    fake_nvml.devices.append(FakeDevice(index=0, pids=[gone.pid]))

    [sample] = NvmlBackend().sample()

    [process] = sample.processes
    assert (process.pid, process.allocation, process.state) == (gone.pid, None, "running")


def test_nvml_backend_integrates_power_when_the_energy_counter_is_not_supported(fake_nvml):
    fake_nvml.devices.append(FakeDevice(index=0, pids=[], energy=False))
    ticks = iter([0.0, 10.0, 20.0])

    backend = NvmlBackend(clock=lambda: next(ticks))
    readings = [backend.sample()[0].energy_j for _ in range(3)]

    # 312.5 W for 10 s between readings.
    assert readings == pytest.approx([0.0, 3125.0, 6250.0])


def test_nvml_backend_skips_a_gpu_that_fails_and_keeps_the_others(fake_nvml, monkeypatch):
    fake_nvml.devices.extend([FakeDevice(index=0, pids=[]), FakeDevice(index=1, pids=[])])

    def temperature(device, sensor):
        if device.index == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return 50

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", temperature)

    samples = NvmlBackend().sample()

    assert [s.gpu for s in samples] == ["GPU-00000001-fake"]


def test_nvml_backend_reports_a_lost_gpu_and_health(fake_nvml, monkeypatch):
    fake_nvml.devices.extend([FakeDevice(index=0, pids=[]), FakeDevice(index=1, pids=[])])

    def temperature(device, sensor):
        if device.index == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return 50

    def ecc(device, error_type, counter_type):
        return 2 if counter_type == 0 else 7  # volatile, aggregate

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", temperature)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEccErrors", ecc)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda d: 0x4 | 0x40)

    lost, fine = NvmlBackend().sample()

    assert lost.gpu == "GPU-00000000-fake" and lost.health.lost
    assert not fine.health.lost
    assert fine.health.ecc_volatile_uncorrected == 2
    assert fine.health.ecc_aggregate_uncorrected == 7
    assert fine.health.throttle == ("power", "hw_thermal")


def test_nvml_backend_with_no_gpus_is_unavailable(fake_nvml):
    with pytest.raises(BackendUnavailable, match="found no GPUs; use --backend simulated"):
        NvmlBackend()
    assert fake_nvml.calls == ["init", "shutdown"]


def test_nvml_backend_without_a_driver_says_so_clearly(monkeypatch):
    # The real nvmlInit, with the driver's library missing (as on this machine, and made
    # certain here so the test means the same on a GPU host).
    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)

    with pytest.raises(BackendUnavailable) as raised:
        NvmlBackend()

    message = str(raised.value)
    assert message.startswith("NVML is not available on this host: ")
    assert "Library Not Found" in message
    assert message.endswith("; use --backend simulated")
