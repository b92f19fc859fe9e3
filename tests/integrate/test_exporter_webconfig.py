"""The exporter's --web.config.file (issue 26): Prometheus' own web configuration format,
TLS with a certificate made here by openssl, basic auth against bcrypt hashes; mistakes in
the file are clear errors naming the key."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import bcrypt
import httpx
import pytest

from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.integrate.exporter import ExporterState, serve
from gpuaudit.integrate.webconfig import load_web_config


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    openssl = shutil.which("openssl")
    assert openssl is not None
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "server.key"), "-out", str(d / "server.crt")],
                   check=True, capture_output=True, timeout=60)
    return d / "server.crt", d / "server.key"


def _config(tmp_path: Path, cert: tuple[Path, Path], users: bool = True) -> Path:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    text = (f"tls_server_config:\n  cert_file: {cert[0]}\n  key_file: {cert[1]}\n")
    if users:
        text += f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    p = tmp_path / "web.yml"
    p.write_text(text)
    return p


def test_tls_and_basic_auth(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    web = load_web_config(_config(tmp_path, cert))
    server = serve(ExporterState(), "127.0.0.1", 0, web=web)
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/metrics"
        with httpx.Client(verify=str(cert[0])) as c:
            assert c.get(url, auth=("prometheus", "s3cret"), timeout=10).status_code == 200
            again = c.get(url, auth=("prometheus", "s3cret"), timeout=10)  # cached check
            assert again.status_code == 200 and "gpuaudit_" in again.text
            bad = c.get(url, auth=("prometheus", "wrong"), timeout=10)
            assert bad.status_code == 401 and "Basic" in bad.headers["www-authenticate"]
            assert c.get(url, timeout=10).status_code == 401
            assert c.get(url, auth=("nobody", "s3cret"), timeout=10).status_code == 401
        with pytest.raises(httpx.TransportError):  # plain HTTP is not served
            httpx.get(url.replace("https", "http"), timeout=5)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("text", "message"), [
    ("http_server_config:\n  http2: true\n", "unsupported web config key"),
    ("tls_server_config:\n  cert_file: a.crt\n", "needs cert_file and key_file"),
    ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n",
     "cannot load the certificate"),
    ("basic_auth_users:\n  alice: plaintext\n", "not a bcrypt hash"),
    ("tls_server_config: [1\n", "not valid YAML"),
])
def test_config_mistakes_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "web.yml"
    p.write_text(text)
    with pytest.raises(InputError, match=message) as e:
        load_web_config(p)
    assert "plaintext" not in str(e.value)


def test_cli_takes_the_web_config(tmp_path: Path, cert: tuple[Path, Path],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "web.yml"
    p.write_text("basic_auth_users:\n  alice: plaintext\n")
    csv = Path(__file__).parents[1] / "data" / "html_report" / "nanogpt_8xh100_head.csv"
    rc = main(["exporter", "--source", str(csv), "--gpu-model", "H100", "--listen",
               "127.0.0.1:0", "--web.config.file", str(p), "--duration", "0.1"])
    assert rc == 2 and "not a bcrypt hash" in capsys.readouterr().err
    rc = main(["exporter", "--source", str(csv), "--gpu-model", "H100", "--listen",
               "127.0.0.1:0", "--web.config.file", str(_config(tmp_path, cert)),
               "--duration", "0.1"])
    assert rc == 0 and "exporting on https://" in capsys.readouterr().err
