from django.contrib import admin

from gates.models import AuditEvent, Criterion, Evaluation, Gate, Membership, Organisation, Pilot, PlanVersion, Report, SignOff


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


class CriterionInline(admin.TabularInline):
    model = Criterion
    extra = 0


@admin.register(PlanVersion)
class PlanVersionAdmin(admin.ModelAdmin):
    list_display = ("pilot", "number", "state", "signed_at")
    readonly_fields = ("state", "sha256", "signed_at")
    inlines = [CriterionInline]


@admin.register(Criterion)
class CriterionAdmin(admin.ModelAdmin):
    list_display = ("plan_version", "gate_number", "key", "metric", "comparison", "op", "threshold", "unit")


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
