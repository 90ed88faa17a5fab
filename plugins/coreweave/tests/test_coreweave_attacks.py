"""Issue 36's hostile programs against the CoreWeave provider's clean leases (the conformance kit's
``attacks``), on the fake whose every sandbox is a container of its own with the service's API on
its loopback (where a vendor daemon listens in a sandbox). Each attack next to its control."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")

from coreweave_fake import API_KEY, FakeCoreWeave  # noqa: E402

from trl_sandbox.plugins import make_provider  # noqa: E402
from trl_sandbox.plugins.testing import attacks  # noqa: E402

MODES = [("auto", True), ("auto", False), ("sweep", False)]


@pytest.fixture
def fake():
    server = FakeCoreWeave().start()
    yield server
    server.stop()


@pytest.fixture
def provider(fake, tmp_path):
    def build(**settings):
        settings = {"api_key": API_KEY, "base_url": fake.base_url, "work_dir": f"{tmp_path}/{{id}}", **settings}
        return make_provider("coreweave", settings)

    return build


def _port(fake) -> int:
    return fake.port


@pytest.mark.parametrize("resident", [True, False])
def test_the_daemons_loopback_is_out_of_reach(fake, provider, resident):
    attacks.check_the_daemons_loopback_is_out_of_reach(lambda: provider(resident_launcher=resident), _port(fake))


def test_positive_control_without_the_network_namespace_a_program_reaches_the_daemon(fake, provider):
    with attacks.without_defence("network"), pytest.raises(AssertionError, match="reached"):
        attacks.check_the_daemons_loopback_is_out_of_reach(lambda: provider(resident_launcher=False), _port(fake))


@pytest.mark.parametrize(("isolation", "resident"), MODES)
def test_the_lease_init_ignores_what_a_program_sends(provider, isolation, resident):
    attacks.check_the_lease_init_ignores_what_a_program_sends(
        lambda: provider(isolation=isolation, resident_launcher=resident))


def test_positive_control_an_init_with_pythons_handlers_dies_of_sigint(provider):
    with attacks.without_defence("signals"), pytest.raises(Exception):  # noqa: B017 - lost sandbox or wrong result
        attacks.check_the_lease_init_ignores_what_a_program_sends(lambda: provider(resident_launcher=False))


@pytest.mark.parametrize("resident", [True, False])
def test_the_kernel_stays_out_of_reach(provider, resident):
    attacks.check_the_kernel_stays_out_of_reach(lambda: provider(resident_launcher=resident))


def test_positive_control_without_a_read_only_proc_sys_a_program_writes_the_hostname(provider):
    with attacks.without_defence("proc"), pytest.raises(AssertionError, match="opened"):
        attacks.check_the_kernel_stays_out_of_reach(lambda: provider(resident_launcher=False))


@pytest.mark.parametrize(("isolation", "resident"), MODES)
def test_ipc_objects_and_keys_die_with_the_lease(provider, isolation, resident):
    """``sweep``: no IPC namespace; the reset removes the SysV objects left (and the queues where
    ``/dev/mqueue`` is mounted, which the fakes do not)."""
    attacks.check_ipc_objects_and_keys_die_with_the_lease(
        lambda: provider(isolation=isolation, resident_launcher=resident), queues=isolation != "sweep")


def test_positive_control_a_sweep_without_its_ipc_wipe_leaves_shared_memory(provider):
    with attacks.without_defence("ipc"), pytest.raises(AssertionError, match="'shm': True"):
        attacks.check_ipc_objects_and_keys_die_with_the_lease(lambda: provider(isolation="sweep", resident_launcher=False),
                                                              queues=False)


def test_positive_control_without_the_launcher_ipc_objects_survive(provider):
    with pytest.raises(AssertionError, match="True"):
        attacks.check_ipc_objects_and_keys_die_with_the_lease(lambda: provider(clean_leases=False))


@pytest.mark.parametrize(("isolation", "resident"), MODES)
def test_the_next_lease_survives_a_broken_path(provider, isolation, resident):
    attacks.check_the_next_lease_survives_a_broken_path(lambda: provider(isolation=isolation, resident_launcher=resident))


def test_output_is_bounded_in_the_sandbox(provider):
    attacks.check_output_is_bounded_in_the_sandbox(provider)


@pytest.mark.parametrize(("isolation", "resident"), MODES)
def test_file_operations_stay_in_the_work_dir(provider, isolation, resident):
    attacks.check_file_operations_stay_in_the_work_dir(lambda: provider(isolation=isolation, resident_launcher=resident))


def test_positive_control_without_the_launcher_the_daemon_follows_a_planted_link(provider):
    with pytest.raises(AssertionError, match="not refused: .*'done'"):
        attacks.check_file_operations_stay_in_the_work_dir(lambda: provider(clean_leases=False), fifo=False)


@pytest.mark.parametrize(("isolation", "resident"), MODES)
def test_the_launchers_tag_stays_hidden(provider, isolation, resident):
    attacks.check_the_launchers_tag_stays_hidden(lambda: provider(isolation=isolation, resident_launcher=resident))


@pytest.mark.parametrize(("isolation", "resident"), [("sweep", True), ("sweep", False), ("auto", True)])
def test_every_setting_keeps_its_sandbox(provider, isolation, resident):
    """Forcing ``isolation=sweep`` while ``resident_launcher`` keeps its default cost a sandbox per
    lease (the resident's tmpfs could not be wiped): now no resident is started there."""
    attacks.check_every_setting_keeps_its_sandbox(lambda: provider(isolation=isolation, resident_launcher=resident))


@pytest.mark.parametrize(("isolation", "resident"), MODES)
def test_a_writer_that_outlives_the_program(provider, isolation, resident):
    attacks.check_a_writer_that_outlives_the_program(lambda: provider(isolation=isolation, resident_launcher=resident))


@pytest.fixture
def outside(fake):
    return lambda sandbox_id, argv: fake.sandboxes[sandbox_id].box.run_outside(argv)


@pytest.mark.parametrize("resident", [True, False])
def test_a_daemon_in_the_sandbox_is_out_of_reach(provider, outside, resident):
    attacks.check_a_daemon_in_the_sandbox_is_out_of_reach(lambda: provider(resident_launcher=resident), outside)


def test_positive_control_without_the_network_namespace_a_program_reaches_the_daemon_in_the_sandbox(provider, outside):
    with attacks.without_defence("network"), pytest.raises(AssertionError, match="daemon daemon"):
        attacks.check_a_daemon_in_the_sandbox_is_out_of_reach(lambda: provider(resident_launcher=False), outside)


@pytest.mark.parametrize(("isolation", "resident"), MODES)
def test_a_wrong_answer_that_signals_its_init_scores_failed(provider, isolation, resident):
    attacks.check_a_wrong_answer_that_signals_its_init_scores_failed(
        lambda: provider(isolation=isolation, resident_launcher=resident))


def test_positive_control_with_pythons_handlers_in_the_init_the_wrong_answer_is_not_failed(provider):
    with attacks.without_defence("signals"), pytest.raises(AssertionError, match="infra"):
        attacks.check_a_wrong_answer_that_signals_its_init_scores_failed(lambda: provider(resident_launcher=False))
