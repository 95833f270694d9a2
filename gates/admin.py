from django.contrib import admin

from gates.models import (
    AuditEvent,
    Criterion,
    Evaluation,
    Gate,
    Membership,
    Organisation,
    Pilot,
    PlanVersion,
    Report,
    SignOff,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "created")
    list_filter = ("kind",)
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "organisation", "role")
    list_filter = ("role",)


class GateInline(admin.TabularInline):
    model = Gate
    extra = 0
    readonly_fields = ("state", "verdict", "opened_at", "closed_at")


@admin.register(Pilot)
class PilotAdmin(admin.ModelAdmin):
    list_display = ("name", "customer", "vendor", "state", "current_gate", "start_date")
    list_filter = ("state",)
    readonly_fields = ("code", "state", "current_gate", "halted_reason")
    inlines = [GateInline]

    def has_add_permission(self, request) -> bool:
        """No "Add pilot" here: a pilot without its plan and gates is broken. A vendor lead creates one on the
        portal's New pilot page (/pilots/new/), which goes through gates.lifecycle.create_pilot."""
        return False


def _frozen(version) -> bool:
    return version is not None and version.pk is not None and version.is_frozen


class CriterionInline(admin.TabularInline):
    """Editable while the plan is a draft; read-only once signed (the models and the database refuse too)."""

    model = Criterion
    extra = 0

    def get_readonly_fields(self, request, obj=None):
        if _frozen(obj):
            return [field.name for field in Criterion._meta.fields]
        return super().get_readonly_fields(request, obj)

    def has_add_permission(self, request, obj=None) -> bool:
        return not _frozen(obj) and super().has_add_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return not _frozen(obj) and super().has_delete_permission(request, obj)


@admin.register(PlanVersion)
class PlanVersionAdmin(admin.ModelAdmin):
    list_display = ("pilot", "number", "state", "signed_at")
    readonly_fields = ("state", "sha256", "signed_at")
    inlines = [CriterionInline]

    def get_readonly_fields(self, request, obj=None):
        if _frozen(obj):
            return [field.name for field in PlanVersion._meta.fields]
        return super().get_readonly_fields(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return not _frozen(obj) and super().has_delete_permission(request, obj)


@admin.register(Criterion)
class CriterionAdmin(admin.ModelAdmin):
    list_display = ("plan_version", "gate_number", "key", "metric", "comparison", "op", "threshold", "unit")
    list_filter = ("plan_version__state",)

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and _frozen(obj.plan_version):
            return [field.name for field in Criterion._meta.fields]
        return super().get_readonly_fields(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and _frozen(obj.plan_version):
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        # Bulk deletion would bypass the per-object check above; the queryset refuses it anyway.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


@admin.register(Gate)
class GateAdmin(admin.ModelAdmin):
    list_display = ("pilot", "number", "name", "state", "verdict")
    readonly_fields = ("state", "verdict", "opened_at", "closed_at")


@admin.register(Evaluation)
class EvaluationAdmin(admin.ModelAdmin):
    list_display = ("gate", "verdict", "simulated", "created")


@admin.register(SignOff)
class SignOffAdmin(admin.ModelAdmin):
    list_display = ("pilot", "gate", "plan_version", "party", "person", "decision", "created")

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("created", "actor_label", "pilot", "action", "object_type", "from_state", "to_state")
    list_filter = ("action",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ("pilot", "kind", "gate", "language", "simulated", "created")
    readonly_fields = ("sha256", "size", "path")
