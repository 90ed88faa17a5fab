"""trl-sandbox provider ``modal``: Modal sandboxes through the official ``modal`` SDK.

``pip install trl-sandbox-modal``, set ``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``, then
``sandbox_provider="modal"``. Settings and behaviour are documented on :class:`ModalProvider` and
in the README; ``python -m trl_sandbox_modal.fake --port 0`` runs an offline fake of the service.
"""

from __future__ import annotations

from trl_sandbox import hookimpl

from .provider import ModalProvider
from .sandbox import ModalSandbox

__all__ = ["ModalProvider", "ModalSandbox"]


@hookimpl
def trl_sandbox_register_providers(register):
    register("modal", ModalProvider)
