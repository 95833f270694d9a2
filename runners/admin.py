from django.contrib import admin

from runners.models import Artifact, Credential, Job, Node, OutputChunk, Site, SiteAgent, Step


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ("name", "pilot", "queue")


@admin.register(Credential)
class CredentialAdmin(admin.ModelAdmin):
    # The key itself is never shown: not in lists, not in forms.
    list_display = ("name", "site", "key_type", "public_fingerprint", "created")
    exclude = ("private_key_encrypted", "passphrase_encrypted", "sealed_key", "sealed_passphrase")
    readonly_fields = ("key_type", "public_fingerprint", "sealed_to")

    def has_add_permission(self, request) -> bool:
        return False  # keys are uploaded through the portal, which encrypts them


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "site", "host", "port", "username", "role", "host_key_state", "simulated")
    list_filter = ("host_key_state", "simulated")
    readonly_fields = ("host_key_state", "host_key_type", "host_key", "host_key_fingerprint", "pending_host_key_type",
                       "pending_host_key", "pending_host_key_fingerprint", "host_key_accepted_at", "inventory", "inventory_at")


class StepInline(admin.TabularInline):
    model = Step
    extra = 0
    fields = ("seq", "name", "arm", "node", "status", "attempts", "requests_done", "requests_total", "error")
    readonly_fields = fields


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("code", "pilot", "gate", "kind", "status", "created", "finished")
    list_filter = ("status", "kind")
    readonly_fields = ("status", "chunk_count")
    inlines = [StepInline]


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ("job", "seq", "name", "arm", "node", "status", "attempts")
    list_filter = ("status", "name")


@admin.register(OutputChunk)
class OutputChunkAdmin(admin.ModelAdmin):
    list_display = ("job", "seq", "stream", "created")


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ("name", "job", "kind", "sha256", "size", "simulated")
    readonly_fields = ("sha256", "size")


@admin.register(SiteAgent)
class SiteAgentAdmin(admin.ModelAdmin):
    """Agents are enrolled with `manage.py site_agent SITE --print-env` (the token is shown there once); here they
    are looked at, never shown their token (only its hash is stored)."""

    list_display = ("site", "token_prefix", "created", "revoked_at", "last_seen", "last_address", "key_fingerprint",
                    "version")
    list_filter = ("revoked_at",)
    exclude = ("token_hash",)
    readonly_fields = ("site", "token_prefix", "public_key", "key_fingerprint", "created_by", "created", "revoked_at",
                       "last_seen", "last_address", "version")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
