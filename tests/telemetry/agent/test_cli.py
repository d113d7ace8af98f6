import subprocess
import sys
import time
from pathlib import Path

import pynvml

import telemetry.agent
from telemetry.agent import main

REPO = Path(telemetry.agent.__file__).parents[2]


def test_once_posts_one_simulated_batch(ingest, sim_node):
    code = main(
        [
            "--server", ingest.url, "--token", "tok", "--backend", "simulated",
            "--node-name", sim_node, "--sim-gpus", "3", "--once",
        ]
    )  # fmt: skip

    assert code == 0
    [received] = ingest.received
    assert received.headers["Authorization"] == "Bearer tok"
    assert received.body["backend"] == "simulated"
    assert received.body["hostname"] == sim_node
    assert len(received.body["gpus"]) == 3


def test_once_reports_the_outcome_of_a_directive_in_a_second_batch(ingest, sim_node):
    ingest.directives.append([{"id": 5, "action": "pause", "pid": 999_999_999}])

    code = main(["--server", ingest.url, "--token", "tok", "--backend", "simulated", "--once"])

    assert code == 0
    assert [b["directive_results"] for b in ingest.delivered] == [
        [],
        [{"id": 5, "outcome": "gone", "detail": "pid 999999999 has exited"}],
    ]


def test_token_can_come_from_the_environment(ingest, monkeypatch):
    monkeypatch.setenv("GPUMARKET_NODE_TOKEN", "from-env")

    assert main(["--server", ingest.url, "--backend", "simulated", "--once"]) == 0
    assert ingest.received[0].headers["Authorization"] == "Bearer from-env"


def test_once_with_the_server_down_exits_1(ingest):
    ingest.status = 503

    assert main(["--server", ingest.url, "--token", "t", "--backend", "simulated", "--once"]) == 1


def test_missing_token_and_bad_arguments_exit_2(monkeypatch, caplog):
    monkeypatch.delenv("GPUMARKET_NODE_TOKEN", raising=False)

    assert main(["--server", "http://127.0.0.1:1", "--backend", "simulated"]) == 2
    assert "a node token is needed" in caplog.text
    assert main(["--server", "http://x", "--token", "t", "--backend", "gpu"]) == 2
    assert main(["--server", "http://x", "--token", "t", "--interval", "0"]) == 2
    assert main(["--help"]) == 0


def test_nvml_without_a_driver_exits_3_with_the_reason(monkeypatch, caplog):
    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)

    assert main(["--server", "http://127.0.0.1:1", "--token", "t", "--backend", "nvml"]) == 3
    assert "NVML is not available on this host" in caplog.text
    assert "use --backend simulated" in caplog.text


def test_runs_until_sigterm_in_its_own_process(ingest, sim_node):
    # The real thing: a separate process, stopped the way a service manager stops it.
    agent = subprocess.Popen(
        [
            sys.executable, "-c", "import sys; from telemetry.agent import main; sys.exit(main(sys.argv[1:]))",
            "--server", ingest.url, "--token", "t", "--backend", "simulated",
            "--node-name", sim_node, "--interval", "0.05",
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while len(ingest.delivered) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        agent.terminate()
        _, stderr = agent.communicate(timeout=10)
    finally:
        agent.kill()

    assert agent.returncode == 0
    assert len(ingest.delivered) >= 3
    assert "received SIGTERM; stopping" in stderr


def test_the_agent_imports_no_django():
    code = (
        "import sys, telemetry.agent, telemetry.agent.loop, telemetry.agent.kubernetes_executor\n"
        "from telemetry.agent import backends, executors, cli, slurm_mapping, kubernetes_mapping\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
