"""Issue 36's hostile programs as a test class a remote plugin inherits: every attack of
``attacks``/``attacks_paths`` next to its control, in each isolation mode, on the plugin's fake.

A plugin's test module defines three fixtures and one class::

    @pytest.fixture
    def provider(fake, tmp_path): ...   # provider(**settings) -> a provider on the fake
    @pytest.fixture
    def daemon_port(fake): ...          # the port the service's API listens on in a sandbox
    @pytest.fixture
    def outside(fake): ...              # outside(sandbox_id, argv): run argv in the sandbox, outside every lease

    class TestAttacks(RemoteLeaseAttacks):
        pass
"""

from __future__ import annotations

import pytest

from trl_sandbox.plugins.testing import attacks

MODES = [("auto", True), ("auto", False), ("sweep", False)]


class RemoteLeaseAttacks:
    """The attacks, each a test method; the fixtures come from the plugin's test module."""

    @pytest.mark.parametrize("resident", [True, False])
    def test_the_daemons_loopback_is_out_of_reach(self, provider, daemon_port, resident):
        attacks.check_the_daemons_loopback_is_out_of_reach(lambda: provider(resident_launcher=resident), daemon_port)

    def test_positive_control_without_the_network_namespace_a_program_reaches_the_daemon(self, provider, daemon_port):
        with attacks.without_defence("network"), pytest.raises(AssertionError, match="reached"):
            attacks.check_the_daemons_loopback_is_out_of_reach(lambda: provider(resident_launcher=False), daemon_port)

    def test_a_sweep_keeps_the_daemons_loopback_out_of_reach(self, provider, daemon_port):
        """Where the image lets the launcher make network, IPC and UTS namespaces without a user
        namespace (root with CAP_SYS_ADMIN, as in the fakes), ``sweep`` programs get them too."""
        attacks.check_the_daemons_loopback_is_out_of_reach(lambda: provider(isolation="sweep"), daemon_port)

    def test_positive_control_a_sweep_without_its_namespaces_reaches_the_daemon(self, provider, daemon_port):
        with attacks.without_defence("sweep_private"), pytest.raises(AssertionError, match="reached"):
            attacks.check_the_daemons_loopback_is_out_of_reach(lambda: provider(isolation="sweep"), daemon_port)

    @pytest.mark.parametrize(("isolation", "resident"), MODES)
    def test_the_lease_init_ignores_what_a_program_sends(self, provider, isolation, resident):
        attacks.check_the_lease_init_ignores_what_a_program_sends(
            lambda: provider(isolation=isolation, resident_launcher=resident))

    def test_positive_control_an_init_with_pythons_handlers_dies_of_sigint(self, provider):
        with attacks.without_defence("signals"), pytest.raises(Exception):  # noqa: B017 - lost sandbox or wrong result
            attacks.check_the_lease_init_ignores_what_a_program_sends(lambda: provider(resident_launcher=False))

    @pytest.mark.parametrize("resident", [True, False])
    def test_the_kernel_stays_out_of_reach(self, provider, resident):
        attacks.check_the_kernel_stays_out_of_reach(lambda: provider(resident_launcher=resident))

    def test_positive_control_without_a_read_only_proc_sys_a_program_writes_the_hostname(self, provider):
        with attacks.without_defence("proc"), pytest.raises(AssertionError, match="opened"):
            attacks.check_the_kernel_stays_out_of_reach(lambda: provider(resident_launcher=False))

    @pytest.mark.parametrize(("isolation", "resident"), MODES)
    def test_ipc_objects_and_keys_die_with_the_lease(self, provider, isolation, resident):
        """Every mode: an IPC namespace per program (``sweep`` where the image allows it, as the
        fakes do), with it every queue and SysV object the program made."""
        attacks.check_ipc_objects_and_keys_die_with_the_lease(
            lambda: provider(isolation=isolation, resident_launcher=resident))

    def test_a_sweep_without_ipc_namespaces_wipes_what_a_program_left(self, provider):
        """Without them, the reset removes the SysV objects and the POSIX queues: the fakes mount no
        ``/dev/mqueue``, so the launcher lists the queues on an mqueue file system of its own."""
        with attacks.without_defence("sweep_private"):
            attacks.check_ipc_objects_and_keys_die_with_the_lease(lambda: provider(isolation="sweep"))

    def test_positive_control_a_sweep_without_its_ipc_wipe_leaves_shared_memory_and_queues(self, provider):
        with attacks.without_defence("sweep_private", "ipc"), \
                pytest.raises(AssertionError, match="'shm': True, 'mq': True"):
            attacks.check_ipc_objects_and_keys_die_with_the_lease(lambda: provider(isolation="sweep"))

    def test_positive_control_without_the_launcher_ipc_objects_survive(self, provider):
        with pytest.raises(AssertionError, match="True"):
            attacks.check_ipc_objects_and_keys_die_with_the_lease(lambda: provider(clean_leases=False))

    @pytest.mark.parametrize(("isolation", "resident"), MODES)
    def test_the_next_lease_survives_a_broken_path(self, provider, isolation, resident):
        attacks.check_the_next_lease_survives_a_broken_path(lambda: provider(isolation=isolation, resident_launcher=resident))

    def test_output_is_bounded_in_the_sandbox(self, provider):
        attacks.check_output_is_bounded_in_the_sandbox(provider)

    @pytest.mark.parametrize(("isolation", "resident"), MODES)
    def test_file_operations_stay_in_the_work_dir(self, provider, isolation, resident):
        attacks.check_file_operations_stay_in_the_work_dir(lambda: provider(isolation=isolation, resident_launcher=resident))

    def test_positive_control_without_the_launcher_the_daemon_follows_a_planted_link(self, provider):
        with pytest.raises(AssertionError, match="not refused: .*'done'"):
            attacks.check_file_operations_stay_in_the_work_dir(lambda: provider(clean_leases=False), fifo=False)

    @pytest.mark.parametrize(("isolation", "resident"), MODES)
    def test_the_launchers_tag_stays_hidden(self, provider, isolation, resident):
        attacks.check_the_launchers_tag_stays_hidden(lambda: provider(isolation=isolation, resident_launcher=resident))

    @pytest.mark.parametrize(("isolation", "resident"), [("sweep", True), ("sweep", False), ("auto", True)])
    def test_every_setting_keeps_its_sandbox(self, provider, isolation, resident):
        """Forcing ``isolation=sweep`` while ``resident_launcher`` keeps its default cost a sandbox per
        lease (the resident's tmpfs could not be wiped): now no resident is started there."""
        attacks.check_every_setting_keeps_its_sandbox(lambda: provider(isolation=isolation, resident_launcher=resident))

    @pytest.mark.parametrize(("isolation", "resident"), MODES)
    def test_a_writer_that_outlives_the_program(self, provider, isolation, resident):
        attacks.check_a_writer_that_outlives_the_program(lambda: provider(isolation=isolation, resident_launcher=resident))

    @pytest.mark.parametrize("resident", [True, False])
    def test_a_daemon_in_the_sandbox_is_out_of_reach(self, provider, outside, resident):
        attacks.check_a_daemon_in_the_sandbox_is_out_of_reach(lambda: provider(resident_launcher=resident), outside)

    def test_positive_control_without_the_network_namespace_a_program_reaches_the_daemon_in_the_sandbox(self, provider, outside):
        with attacks.without_defence("network"), pytest.raises(AssertionError, match="'daemon daemon "):
            attacks.check_a_daemon_in_the_sandbox_is_out_of_reach(lambda: provider(resident_launcher=False), outside)

    def test_positive_control_without_hiding_its_sockets_a_program_reaches_the_daemon_in_the_file_system(
            self, provider, outside):
        """The network namespace alone hides the abstract socket and the loopback, not a socket in
        the file system."""
        with attacks.without_defence("sockets"), pytest.raises(AssertionError, match="Error daemon"):
            attacks.check_a_daemon_in_the_sandbox_is_out_of_reach(lambda: provider(resident_launcher=False), outside)

    @pytest.mark.parametrize(("isolation", "resident"), MODES)
    def test_the_program_holds_no_privilege(self, provider, isolation, resident):
        """Namespaces: uid 1000 in a user namespace of its own, so its exec cleared every capability;
        ``sweep`` on the fakes: uid 0 without capabilities (they map no other uid to switch to)."""
        attacks.check_the_program_holds_no_privilege(lambda: provider(isolation=isolation, resident_launcher=resident),
                                                     user=isolation != "sweep")

    def test_positive_control_without_its_user_namespace_the_program_is_uid_0(self, provider):
        with attacks.without_defence("user"), pytest.raises(AssertionError, match="uid: "):
            attacks.check_the_program_holds_no_privilege(lambda: provider(resident_launcher=False))

    def test_without_shedding_capabilities_the_user_namespace_alone_leaves_none(self, provider):
        """Its own user namespace holds even where the launcher forgot to drop the capabilities: the
        exec as uid 1000 clears them, and none reach the lease's namespaces. The positive control
        below is the same program with both defences off."""
        with attacks.without_defence("caps"):
            attacks.check_the_program_holds_no_privilege(lambda: provider(resident_launcher=False))

    def test_positive_control_without_either_the_program_keeps_root_and_sets_the_hostname(self, provider):
        with attacks.without_defence("caps", "user"), pytest.raises(AssertionError, match="capabilities: "):
            attacks.check_the_program_holds_no_privilege(lambda: provider(resident_launcher=False))

    @pytest.mark.parametrize(("isolation", "resident"), MODES)
    def test_a_wrong_answer_that_signals_its_init_scores_failed(self, provider, isolation, resident):
        attacks.check_a_wrong_answer_that_signals_its_init_scores_failed(
            lambda: provider(isolation=isolation, resident_launcher=resident))

    def test_positive_control_with_pythons_handlers_in_the_init_the_wrong_answer_is_not_failed(self, provider):
        with attacks.without_defence("signals"), pytest.raises(AssertionError, match="infra"):
            attacks.check_a_wrong_answer_that_signals_its_init_scores_failed(lambda: provider(resident_launcher=False))
