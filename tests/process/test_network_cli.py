"""``fiberflow network ...`` end to end: create the root, request, issue, verify a map."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli.main import main
from flows.config.runtime import load_config
from flows.network.identity import load_or_create_identity
from flows.network.map import NetworkMap, NodeInfo
from flows.network.trust import NetworkRoot

FIBERFLOW = [str(Path(sys.executable).with_name("fiberflow"))]
ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"
ROOT_CERT = "root/network-root.cert.pem"


def node_config(directory: Path, name: str, short: str) -> Path:
    path = directory / f"{short}.toml"
    path.write_text(
        f'name = "{name}"\n'
        f'database_url = "sqlite:///{short}.db"\n'
        'transport_url = "sqlite:///queue.db"\n'
        'network_root = "root/network-root.cert.pem"\n'
        f'certificate = "{short}.cert.pem"\n'
    )
    return path


def publish_as_node(config_path: Path) -> Path:
    """What a starting node does: publish its node-info with its certificate, signed."""
    config = load_config(config_path)
    assert config.key_file is not None and config.certificate is not None
    identity = load_or_create_identity(config.key_file, config.name)
    info = NodeInfo(config.name, config.name, "q", certificate=config.certificate.read_text())
    return NetworkMap(config_path.parent / "network-map").publish(info, identity)


def test_create_request_issue_and_verify_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["network", "create-root", "--out", "root", "--name", "CN=Root,O=Net"]) == 0
    assert stat.S_IMODE((tmp_path / "root/network-root.key.pem").stat().st_mode) == 0o600
    assert "CN=Root,O=Net" in capsys.readouterr().out
    for name, short in ((ALICE, "alice"), (BOB, "bob")):
        config = node_config(tmp_path, name, short)
        assert main(["network", "request", "--config", str(config), "--out", f"{short}.csr"]) == 0
        assert (load_config(config).key_file or Path()).is_file()  # created for the request
        assert main(
            ["network", "issue", "--root-dir", "root", "--csr", f"{short}.csr",
             "--out", f"{short}.cert.pem", "--days", "30"]
        ) == 0  # fmt: skip
        publish_as_node(config)
    capsys.readouterr()
    verify = ["network", "verify", "--root", "root/network-root.cert.pem"]
    assert main(verify) == 0
    out = capsys.readouterr().out
    assert f"accepted: {ALICE}" in out and f"accepted: {BOB}" in out
    assert "2 accepted, 0 refused" in out
    # Someone changes Bob's address in the map: verify names the file and the reason.
    bob_file = tmp_path / "network-map" / f"{NodeInfo(BOB, BOB, 'q').node_key}.json"
    document = json.loads(bob_file.read_text())
    document["address"] = "O=Mallory,L=London,C=GB"
    bob_file.write_text(json.dumps(document))
    assert main(verify) == 1
    out = capsys.readouterr().out
    assert (
        f"{bob_file.name}: refused: {BOB}: signature does not verify: the node-info was "
        "changed after it was signed"
    ) in out
    assert f"accepted: {ALICE}" in out and "1 accepted, 1 refused" in out


def test_errors_are_one_line_on_stderr_with_exit_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["network", "create-root", "--out", "root"]) == 0
    capsys.readouterr()
    cases = [
        (["create-root", "--out", "root"], "root/network-root.key.pem exists: refusing"),
        (["issue", "--root-dir", "root", "--csr", "no.csr", "--out", "x"], "no.csr: No such"),
        (["issue", "--root-dir", "nowhere", "--csr", "no.csr", "--out", "x"], "root key"),
        (["verify", "--root", "root/network-root.cert.pem"], "network-map does not exist"),
        (["verify", "--root", "missing.pem"], "network root certificate missing.pem: cannot"),
        (["request", "--config", "none.toml", "--out", "x"], "none.toml: cannot read"),
    ]
    (tmp_path / "bad.csr").write_text("not a request")
    cases.append(
        (["issue", "--root-dir", "root", "--csr", "bad.csr", "--out", "x"], "not a PEM certificate")
    )
    for arguments, expected in cases:
        assert main(["network", *arguments]) == 2, arguments
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.splitlines()
        assert len(lines) == 1 and expected in lines[0], (arguments, captured.err)
        assert lines[0].startswith(f"fiberflow network {arguments[0]}: ")
    assert not (tmp_path / "x").exists()


def test_the_console_script_has_help_for_each_network_command() -> None:
    done = subprocess.run([*FIBERFLOW, "network", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    for command in ("create-root", "request", "issue", "issue-tls", "node-info", "verify"):
        assert command in done.stdout
    done = subprocess.run(
        [*FIBERFLOW, "network", "issue", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "--root-dir" in done.stdout and "no intermediate" in done.stdout


def test_node_info_writes_the_node_info_signed_without_starting_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["network", "create-root", "--out", "root"]) == 0
    config = node_config(tmp_path, ALICE, "alice")
    config.write_text(
        config.read_text().replace(
            'transport_url = "sqlite:///queue.db"',
            'transport_url = "amqp://alice:secret@broker.a.example:5672/alice"\ntopology = "p2p"',
        )
    )
    assert main(["network", "request", "--config", str(config), "--out", "alice.csr"]) == 0
    issue = ["network", "issue", "--root-dir", "root", "--csr", "alice.csr"]
    assert main([*issue, "--out", "alice.cert.pem"]) == 0
    capsys.readouterr()
    assert main(["network", "node-info", "--config", str(config), "--out", "handed-over"]) == 0
    out = capsys.readouterr().out
    assert "certified, signed" in out
    rooted = NetworkMap(tmp_path / "handed-over", NetworkRoot.load(tmp_path / ROOT_CERT))
    assert rooted.rejected() == []
    info = rooted.lookup(ALICE)
    assert info is not None
    assert info.transport == "amqp://broker.a.example:5672/alice"  # no credentials published
    key_file = load_config(config).key_file
    assert key_file is not None
    identity = load_or_create_identity(key_file, ALICE)
    assert info.agreement_key == identity.agreement_key_hex  # published, under the signature
    assert f"agreement key: {identity.agreement_key_hex}" in out
    # A certificate that is not the node's own: refused, nothing written.
    bob_config = node_config(tmp_path, BOB, "bob")
    (tmp_path / "bob.cert.pem").write_bytes((tmp_path / "alice.cert.pem").read_bytes())
    capsys.readouterr()
    assert main(["network", "node-info", "--config", str(bob_config), "--out", "bob-out"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("fiberflow network node-info: ") and len(error.splitlines()) == 1
    assert not (tmp_path / "bob-out").exists()
