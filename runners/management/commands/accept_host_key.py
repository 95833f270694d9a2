"""Show or accept a node's pending SSH host key (first contact records it; nothing runs until it is accepted).

    manage.py accept_host_key NODE_CODE                 show the state and the waiting fingerprint
    manage.py accept_host_key NODE_CODE --scan          contact the node once to record its key
    manage.py accept_host_key NODE_CODE SHA256:...      accept the waiting key, if it has this fingerprint
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gates.codes import CodeNotFound, find_by_code
from gates.lifecycle import audit
from gates.management.lookup import command_line_actor
from gates.models import AuditAction
from runners.models import Node
from runners.ssh import HostKeyChanged, HostKeyPending, SSHError, accept_host_key, connect


class Command(BaseCommand):
    help = "Show, record (--scan) or accept a node's pending SSH host key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="the node's code, short code (first 8 characters) or unique name")
        parser.add_argument("fingerprint", nargs="?", help="the SHA256:… fingerprint you verified with the node's admin")
        parser.add_argument("--scan", action="store_true", help="connect once to record the key the node offers")

    def handle(self, *args, **opts) -> None:
        try:
            node = find_by_code(Node.objects.select_related("credential"), opts["node"], "node", name_field="name")
        except CodeNotFound as error:
            raise CommandError(str(error)) from None
        if opts["scan"]:
            try:
                connect(node).close()
                self.stdout.write(f"{node.name}: the accepted key {node.host_key_fingerprint} still matches")
            except (HostKeyPending, HostKeyChanged) as exc:
                self.stdout.write(str(exc))
            except SSHError as exc:
                raise CommandError(str(exc)) from None
            node.refresh_from_db()
        if opts["fingerprint"]:
            fingerprint = opts["fingerprint"].strip()
            try:
                accepted = accept_host_key(node, fingerprint, label=command_line_actor())
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            # The same audit event as the portal's acceptance, by the command (it has no signed-in person).
            audit(accepted.site.pilot, accepted.host_key_accepted_label, AuditAction.NODE_HOST_KEY_ACCEPTED, accepted,
                  Node.HostKeyState.PENDING, Node.HostKeyState.ACCEPTED, fingerprint=fingerprint)
            self.stdout.write(self.style.SUCCESS(f"{node.name}: host key {opts['fingerprint']} accepted"))
            return
        self.stdout.write(f"{node.name} ({node.username}@{node.host}:{node.port}): {node.get_host_key_state_display()}")
        if node.host_key_fingerprint:
            self.stdout.write(f"  accepted: {node.host_key_type} {node.host_key_fingerprint}")
        if node.pending_host_key_fingerprint:
            self.stdout.write(f"  waiting:  {node.pending_host_key_type} {node.pending_host_key_fingerprint}")
