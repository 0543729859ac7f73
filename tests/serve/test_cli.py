"""``qkv serve`` on the command line: start-up errors, and a graceful stop on SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx

from qkv.cli import main
from qkv.jobs import load_run
from qkv.serve import listen


def start_error(capsys, *argv: object) -> str:
    """The one line ``qkv serve`` prints when it refuses to start (exit status 2)."""
    assert main(["serve", *map(str, argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_a_broken_run_folder_stops_start_up(capsys, runs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(runs["classifier"][0], broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    assert "model.safetensors" in start_error(capsys, "--model", broken, "--port", 0)
    assert "no such run folder" in start_error(capsys, "--model", tmp_path / "none")
    folder = runs["tagger"][0]
    assert "two models are called" in start_error(capsys, "--model", folder, "--model", folder)


def test_bad_options_and_a_taken_port(capsys, runs):
    folder = runs["tagger"][0]
    assert "--max-inputs 0" in start_error(capsys, "--model", folder, "--max-inputs", 0)
    taken = listen("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        assert "cannot listen" in start_error(capsys, "--model", folder, "--port", port)
    finally:
        taken.close()


def test_sigterm_finishes_the_requests_in_flight(runs):
    """A request waiting in the batcher when SIGTERM arrives is still answered."""
    folder, sentence = runs["translation"]
    command = [sys.executable, "-m", "qkv", "serve", "--model", f"demo={folder}", "--port", "0"]
    command += ["--batch-wait-ms", "1500", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("qkv serve: http://127.0.0.1:"), process.stderr.read()
        url = line.split()[2]
        httpx.get(url + "health", timeout=30).raise_for_status()
        answers: list[httpx.Response] = []
        body = {"sentences": [sentence], "beam": 1}
        thread = threading.Thread(
            target=lambda: answers.append(httpx.post(url + "v1/translate", json=body, timeout=60))
        )
        thread.start()
        time.sleep(0.5)  # the request is now gathered, waiting out --batch-wait-ms
        process.send_signal(signal.SIGTERM)
        thread.join(60)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert answers and answers[0].status_code == 200
    alone = load_run(folder, beam_size=1).translate([sentence])[0]
    assert answers[0].json()["translations"][0] == alone
