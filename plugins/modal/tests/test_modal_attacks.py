"""Issue 36's hostile programs against the modal provider's clean leases (the conformance kit's
``attacks``), on the fake whose every sandbox is a container of its own sharing the host's
loopback, where the fake's own gRPC API listens, as a vendor's daemon would be in reach.
Each attack next to its control."""

from __future__ import annotations

import pytest

from trl_sandbox.plugins.testing import attacks
from trl_sandbox.plugins.testing.attack_suite import RemoteLeaseAttacks


@pytest.fixture
def daemon_port(fake):
    return fake.port


class TestAttacks(RemoteLeaseAttacks):
    """Every attack of the conformance kit, on this plugin's fake."""

    def test_positive_control_without_the_launcher_the_daemon_follows_a_planted_link(self, provider, monkeypatch):
        """This provider has no daemon file API to fall back on: its file operations always walk the
        path without following links, with or without the launcher. The control is what a plain
        file operation through Modal's exec does (``cat > path``, as the SDK's examples write
        files): the same check catches it writing through the planted links."""
        from trl_sandbox_modal.sandbox import ModalSandbox

        from trl_sandbox.remote import files

        async def naive_write(self, path, data):
            full, _ = files.confine(self.work_dir, path)  # the path check stays: the links are the point
            await self._shell(["/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", full], "write",
                              stdin=bytes(data))

        async def naive_read(self, path):
            full, _ = files.confine(self.work_dir, path)
            code, out, err = await self._shell(["cat", "--", full], "read")
            if code:
                raise FileNotFoundError(path)
            return out.encode()

        monkeypatch.setattr(ModalSandbox, "write_file", naive_write)
        monkeypatch.setattr(ModalSandbox, "read_file", naive_read)
        with pytest.raises(AssertionError, match="not refused: .*'done'"):
            attacks.check_file_operations_stay_in_the_work_dir(lambda: provider(clean_leases=False), fifo=False)
