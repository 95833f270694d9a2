"""The portal's pages about pilots, plans, gates, reports and the audit log.

Every object is reached through portal.access (404 outside the pilot, 403 for a role that may not);
every state change goes through gates.lifecycle; what a role may not do is not offered.
"""

from __future__ import annotations

from collections import defaultdict
from uuid import UUID

import yaml
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from gates import lifecycle, policy
from gates.judge import planner
from gates.lifecycle import NextAction
from gates.models import (
    LANGUAGE_SESSION_KEY,
    AuditAction,
    AuditEvent,
    Criterion,
    Evaluation,
    Gate,
    Membership,
    Notification,
    Party,
    Pilot,
    PlanVersion,
    Profile,
    Report,
    ReportJob,
    Role,
    SignOff,
    UploadVerification,
)
from gates.outcome import outcome_of
from gates.plan import PlanError, load_plan
from gates.policy import Act
from gates.sizing import SizingSettingsError, validate_settings
from portal import access, notifications
from portal.access import get_gate_for_user, get_pilot_for_user
from portal.forms import (
    CriterionForm,
    GateSignOffForm,
    NewPilotForm,
    PdfUploadForm,
    PlanSignForm,
    TraceUploadForm,
    max_report_bytes,
)
from portal.tasks import checks_left, queue_report_check, queue_upload_verification
from portal.templatetags.portal import simulated_pilot_ids
from portal.uploads import receive_upload
from reports import charts, findings
from reports import tasks as report_tasks
from reports.context import TRACE_GATE, trace_of_job
from reports.service import procurement_report_of
from runners import orchestration
from runners.config import DeploymentSettingsError, validate_deployment
from runners.evaluation import extension_history
from runners.models import Job
from runners.pending import pending_actions, pending_actions_by_pilot

PAGE_SIZE = 50
PILOTS_PER_PAGE = 25

# ── Signing in ────────────────────────────────────────────────────────────────────────────────


class ThrottledLoginView(auth_views.LoginView):
    """Django's login; throttling is django-axes (portal.signin), counted in the database for every process.

    A signed-in person's chosen language is restored into the session and the language cookie.
    """

    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def form_valid(self, form) -> HttpResponse:
        response = super().form_valid(form)
        language = Profile.objects.filter(user=form.get_user()).values_list("language", flat=True).first()
        if language:
            self.request.session[LANGUAGE_SESSION_KEY] = language
            response.set_cookie(
                settings.LANGUAGE_COOKIE_NAME, language, samesite="Lax", secure=settings.SESSION_COOKIE_SECURE
            )
        return response


@require_POST
def set_language(request: HttpRequest) -> HttpResponse:
    """The person's language: remembered on their profile (all devices), in the session and a cookie."""
    language = request.POST.get("language", "")
    target = request.POST.get("next") or reverse("home")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = reverse("home")
    if language not in dict(settings.LANGUAGES):
        messages.error(request, _("Unknown language."))
        return redirect(target)
    if request.user.is_authenticated:
        Profile.objects.update_or_create(user=request.user, defaults={"language": language})
        request.session[LANGUAGE_SESSION_KEY] = language
        notifications.relocalise(request.user, language)
    translation.activate(language)
    response = redirect(target)
    response.set_cookie(settings.LANGUAGE_COOKIE_NAME, language, samesite="Lax", secure=settings.SESSION_COOKIE_SECURE)
    return response


# ── Home: pilots and what to do ───────────────────────────────────────────────────────────────


@login_required
def home(request: HttpRequest) -> HttpResponse:
    page = Paginator(access.pilots_for(request).defer("deployment"), PILOTS_PER_PAGE).get_page(request.GET.get("page"))
    pilots = list(page.object_list)
    mine = policy.roles_by_pilot(request.user, pilots)
    simulated = simulated_pilot_ids(pilots)
    gates = lifecycle.current_gates(pilots)
    pending = pending_actions_by_pilot(pilots, gates)
    todo = []
    for pilot in pilots:
        gate = gates.get(pilot.pk)
        if gate is not None:
            gate.pilot = pilot
        pilot.current = gate
        pilot.my_roles = mine[pilot.pk]
        pilot.simulated = pilot.pk in simulated
        pilot.actions = [
            {**a, "label": NextAction(a["action"]).label, "role_label": Role(a["role"]).label}
            for a in pending.get(pilot.pk, [])
        ]
        todo += [{"pilot": pilot, **a} for a in pilot.actions if a["role"] in pilot.my_roles]
    notes = list(Notification.objects.filter(user=request.user, read_at__isnull=True)[:20])
    return render(
        request,
        "gates/home.html",
        {"page": page, "pilots": pilots, "todo": todo, "notifications": notes,
         "may_create": _vendor_led_by(request.user) is not None},
    )


def _vendor_led_by(user):
    """The vendor organisation `user` leads (the first by name), or None."""
    membership = (Membership.objects.filter(user=user, role=Role.VENDOR_LEAD, organisation__kind="vendor")
                  .select_related("organisation").order_by("organisation__name").first())
    return membership.organisation if membership else None


@login_required
def pilot_new(request: HttpRequest) -> HttpResponse:
    """A vendor lead's new pilot, made by the lifecycle with its plan and four gates; the customer's people added."""
    vendor = _vendor_led_by(request.user)
    if vendor is None:
        raise PermissionDenied(_("Only a vendor lead may create a pilot."))
    form = NewPilotForm(vendor, request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            plan = load_plan(data["plan"])
        except PlanError as error:
            form.add_error("plan", str(error))
        else:
            try:
                with transaction.atomic():
                    pilot = lifecycle.create_pilot(name=data["name"], customer=data["customer"], vendor=vendor,
                                                   who=request.user, plan=plan, start_date=data["start_date"])
                    for field_name, role in NewPilotForm.PERSON_FIELDS.items():
                        for person in data[field_name]:
                            try:  # the lifecycle refuses a person of another organisation too
                                lifecycle.add_pilot_member(pilot, person, role)
                            except lifecycle.TransitionRefused as refused:
                                form.add_error(field_name, refused.message)
                                raise
            except lifecycle.TransitionRefused as refused:  # nothing was created: the form says why
                if form.is_valid():
                    form.add_error(None, refused.message)
            else:
                messages.success(request, _("Pilot %(name)s created with plan %(plan)s and its four gates.")
                                 % {"name": pilot.name, "plan": data["plan"]})
                return redirect("pilot", pilot.code)
    return render(request, "gates/pilot_new.html", {"form": form, "vendor": vendor})


@login_required
@require_POST
def notifications_read(request: HttpRequest) -> HttpResponse:
    Notification.objects.filter(user=request.user, read_at__isnull=True).update(read_at=timezone.now())
    return redirect("home")


# ── A pilot: overview and timeline ────────────────────────────────────────────────────────────


def _who(pilot: Pilot) -> dict[str, list[str]]:
    """Role → names of the people holding it in this pilot's two organisations."""
    names: dict[str, list[str]] = defaultdict(list)
    for membership in (
        Membership.objects.filter(organisation_id__in=[pilot.customer_id, pilot.vendor_id])
        .select_related("user")
        .order_by("user__username")
    ):
        names[membership.role].append(membership.user.get_full_name() or membership.user.get_username())
    return names


def _describe_actions(pilot: Pilot, actions: list[dict]) -> list[dict]:
    who = _who(pilot) if actions else {}
    roles = dict(Membership._meta.get_field("role").choices)
    return [
        {
            **a,
            "label": NextAction(a["action"]).label,
            "role_label": roles.get(a["role"], a["role"]),
            "people": who.get(a["role"], []),
        }
        for a in actions
    ]


def _timeline(pilot: Pilot, gates: list[Gate], weeks: int) -> dict:
    today = timezone.localdate()
    current_week = (today - pilot.start_date).days // 7 + 1
    rows = []
    for gate in gates:
        opened = timezone.localdate(gate.opened_at) if gate.opened_at else None
        closed = timezone.localdate(gate.closed_at) if gate.closed_at else None
        actual_start = actual_end = None
        if opened:
            actual_start = max(1, min(weeks, (opened - pilot.start_date).days // 7 + 1))
            end_day = closed or today
            actual_end = max(actual_start, min(weeks, (end_day - pilot.start_date).days // 7 + 1))
        rows.append(
            {
                "gate": gate,
                "opened": opened,
                "closed": closed,
                "actual_start": actual_start,
                "actual_end_col": actual_end + 1 if actual_end else None,
                "planned_end_col": gate.week_end + 1,
            }
        )
    return {
        "weeks": range(1, weeks + 1),
        "rows": rows,
        "current_week": current_week if 1 <= current_week <= weeks else None,
    }


@login_required
def pilot_detail(request: HttpRequest, code: UUID) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    gates = list(pilot.gates.all())
    for gate in gates:
        gate.pilot = pilot
    plan = pilot.latest_plan
    weeks = int((plan.document or {}).get("calendar_weeks", 10)) if plan else 10
    weeks = max(weeks, max((g.week_end for g in gates), default=weeks))
    runs = list(Job.objects.filter(pilot=pilot).select_related("gate", "created_by")[:10])
    return render(
        request,
        "gates/pilot.html",
        {
            "pilot": pilot,
            "gates": gates,
            "plan": plan,
            "timeline": _timeline(pilot, gates, weeks),
            "actions": _describe_actions(pilot, pending_actions(pilot)),
            "runs": runs,
            "procurement": procurement_report_of(pilot),
            "outcome": outcome_of(pilot),
            "can_make_procurement": access.offers(pilot, request.user, Act.MAKE_PROCUREMENT, pilot),
        },
    )


# ── The plan: review, edit while draft, sign, amend ───────────────────────────────────────────


@login_required
def plan_detail(request: HttpRequest, code: UUID) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    versions = list(pilot.plan_versions.order_by("-number"))
    if not versions:
        raise Http404("This pilot has no plan")
    number = request.GET.get("v")
    version = next((v for v in versions if str(v.number) == number), versions[0])
    version.pilot = pilot
    editable = access.offers(pilot, request.user, Act.EDIT_PLAN, version)
    signoffs = list(version.signoffs.select_related("person"))
    criteria = list(version.criteria.all())
    gate_names = {g.number: g for g in pilot.gates.all()}
    groups = []
    for criterion in criteria:
        if not groups or groups[-1]["number"] != criterion.gate_number:
            groups.append(
                {"number": criterion.gate_number, "gate": gate_names.get(criterion.gate_number), "criteria": []}
            )
        criterion.form = CriterionForm.for_criterion(criterion) if editable else None
        groups[-1]["criteria"].append(criterion)
    edits = AuditEvent.objects.filter(
        Q(action=AuditAction.CRITERION_EDITED, object_id__in=[str(c.pk) for c in criteria])
        | Q(action__in=(AuditAction.PLAN_SAMPLE_TRACE, AuditAction.PLAN_SAMPLE_TRACE_UNSIGNED), object_id=str(version.pk)),
        pilot=pilot,
    ).select_related("actor")[:30]
    try:
        sample_trace = version.to_plan().gate(TRACE_GATE).sample_trace
    except ValueError:
        sample_trace = False
    for group in groups:
        group["trace_gate"] = group["number"] == TRACE_GATE
    return render(
        request,
        "gates/plan.html",
        {
            "pilot": pilot,
            "version": version,
            "versions": versions,
            "groups": groups,
            "editable": editable,
            "signoffs": signoffs,
            "can_sign": access.offers(pilot, request.user, Act.SIGN_PLAN, version),
            "sign_form": PlanSignForm(),
            "edits": edits,
            "can_amend": access.offers(pilot, request.user, Act.AMEND_PLAN, pilot),
            "plan_sha256": version.sha256
            or (version.to_plan().sha256 if version.state == PlanVersion.State.DRAFT else ""),
            "planner": planner_figures(pilot, version),
            "sample_trace": sample_trace,
        },
    )


def measured_spread(pilot) -> float | None:
    """The CV across repetitions G1 measured (the worst of TTFT p50 and throughput), once G1 was judged."""
    evaluation = (
        Evaluation.objects.filter(gate__pilot=pilot, gate__number=1)
        .exclude(verdict=Gate.Verdict.INVALID)
        .order_by("-pk")
        .first()
    )
    if evaluation is None:
        return None
    values = [
        row.get(key)
        for row in (evaluation.result or {}).get("spread", [])
        if row.get("phase") == "measure"
        for key in ("ttft_p50_cv", "throughput_cv")
    ]
    values = [float(v) for v in values if isinstance(v, (int, float)) and 0 < v < 1]
    return max(values) if values else None  # unrounded: a simulator's 0.0007 % is not "no spread"


def planner_figures(pilot, version) -> dict | None:
    """The sample-size planner's figures for a plan version (docs/judge.md), cached by plan and spread."""
    try:
        plan = version.to_plan()
    except ValueError:
        return None
    spread = measured_spread(pilot)
    key = f"planner:{plan.sha256}:{spread}"
    figures = cache.get(key)
    if figures is None:
        figures = planner.summary(plan, spread=spread)
        cache.set(key, figures, 24 * 3600)
    figures = dict(figures)
    figures["spread_percent"] = f"{figures['spread'] * 100:.3g}"
    figures["power_percent"] = f"{figures['power'] * 100:.0f}"
    figures["planned"] = [
        {**c, "power_percent": None if c["power_at_plan"] is None else f"{c['power_at_plan'] * 100:.0f}"}
        for c in figures["criteria"]
        if c["kind"] in ("comparison", "cv", "drift", "rate", "timing")
    ]
    return figures


@login_required
@require_POST
def criterion_edit(request: HttpRequest, code: UUID, key: str) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    access.require_act(pilot, request.user, Act.EDIT_PLAN)
    version = pilot.latest_plan
    criterion = get_object_or_404(Criterion, plan_version=version, key=key)
    form = CriterionForm.for_criterion(criterion, data=request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(
                request,
                f"{criterion.key} · {form.fields[field].label if field in form.fields else field}: {' '.join(errors)}",
            )
        return redirect(reverse("plan", args=[pilot.code]) + f"#c-{criterion.key}")
    changes = form.changes(criterion)
    if changes:
        try:
            lifecycle.edit_criterion(criterion, request.user, **changes)
        except lifecycle.TransitionRefused as refused:
            messages.error(request, refused.message)
        except ValidationError as error:
            messages.error(request, f"{criterion.key}: {'; '.join(error.messages)}")
        except ValueError as error:  # the edited plan no longer validates (gates.plan.PlanError)
            messages.error(request, f"{criterion.key}: {error}")
        else:
            messages.success(request, _("%(key)s updated.") % {"key": criterion.key})
    return redirect(reverse("plan", args=[pilot.code]) + f"#c-{criterion.key}")


@login_required
@require_POST
def plan_sample_trace(request: HttpRequest, code: UUID) -> HttpResponse:
    """Allow (or not) G4 to replay a generated sample trace: a value of the draft plan, signed with it."""
    pilot = get_pilot_for_user(request, code)
    access.require_act(pilot, request.user, Act.EDIT_PLAN)
    allowed = request.POST.get("sample_trace") == "allowed"
    try:
        lifecycle.set_sample_trace(pilot.latest_plan, allowed, request.user)
    except lifecycle.TransitionRefused as refused:
        messages.error(request, refused.message)
    else:
        messages.success(request, _("G4 may replay a generated sample trace.") if allowed
                         else _("G4 replays the customer's trace only."))
    return redirect(reverse("plan", args=[pilot.code]) + f"#g{TRACE_GATE}-h")


@login_required
@require_POST
def plan_sign(request: HttpRequest, code: UUID) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    access.require_act(pilot, request.user, Act.SIGN_PLAN)
    form = PlanSignForm(request.POST)
    if form.is_valid():
        try:
            lifecycle.sign_plan(pilot.latest_plan, request.user, comment=form.cleaned_data["comment"])
        except lifecycle.TransitionRefused as refused:
            messages.error(request, refused.message)
        else:
            messages.success(request, _("You signed the plan."))
            notifications.sweep([Pilot.objects.get(pk=pilot.pk)])
    return redirect("plan", pilot.code)


@login_required
@require_POST
def plan_amend(request: HttpRequest, code: UUID) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    access.require_act(pilot, request.user, Act.AMEND_PLAN)
    try:
        version = lifecycle.amend_plan(pilot, request.user)
    except lifecycle.TransitionRefused as refused:
        messages.error(request, refused.message)
    else:
        messages.success(
            request,
            _("Plan v%(number)s is a draft: change it, then both parties sign it again.") % {"number": version.number},
        )
        notifications.sweep([pilot])
    return redirect("plan", pilot.code)


# ── A gate: verdicts, runs, sign-off, reports ─────────────────────────────────────────────────


def _charts(evaluation: Evaluation | None) -> list:
    """The evaluation's SVG charts (reports.charts), as the gate report draws them.

    An evaluation never changes, so its charts are drawn once per language and kept in the cache.
    """
    if evaluation is None or not evaluation.result:
        return []
    key = f"portal-charts:{evaluation.pk}:{evaluation.created.timestamp()}:{translation.get_language()}"
    drawn = cache.get(key)
    if drawn is None:
        try:
            drawn = [{"key": c.key, "title": str(c.title), "svg": c.svg} for c in charts.gate_charts(evaluation.result)]
        except (KeyError, TypeError, ValueError):
            drawn = []
        cache.set(key, drawn, 3600)
    return drawn


def _criteria_view(gate: Gate, result: dict, language: str) -> list[dict]:
    chinese = language.startswith("zh")
    if result.get("criteria"):
        rows = []
        for item in result["criteria"]:
            def said(field: str, item=item) -> str:
                return (item.get(f"{field}_zh") if chinese else "") or item.get(field, "")

            rows.append({**item, "text": said("description"), "rule": said("rule"), "explanation": said("explanation")})
        return rows
    version = gate.pilot.signed_plan or gate.pilot.latest_plan
    criteria = version.criteria.filter(gate_number=gate.number) if version else []
    return [
        {
            "key": c.key,
            "text": (c.description_zh if chinese else "") or c.description,
            "metric": c.metric,
            "statistic": c.statistic,
            "comparison": c.comparison,
            "op": c.get_op_display(),
            "threshold": c.threshold,
            "unit": c.unit,
            "verdict": "",
        }
        for c in criteria
    ]


@login_required
def gate_detail(request: HttpRequest, code: UUID, number: int) -> HttpResponse:
    gate = get_gate_for_user(request, code, number)
    pilot = gate.pilot
    evaluation = gate.latest_evaluation
    result = evaluation.result if evaluation else {}
    runs = list(Job.objects.filter(gate=gate).select_related("gate", "created_by")[:10])
    signoffs = list(gate.signoffs.select_related("person", "evaluation"))
    can_sign_off = access.offers(pilot, request.user, Act.SIGN_OFF_GATE, gate)
    party = policy.signing_party(Act.SIGN_OFF_GATE, gate, access.roles_of(pilot, request.user)) if can_sign_off else None
    trace = orchestration.current_trace(gate) if gate.number == TRACE_GATE else None
    return render(
        request,
        "gates/gate.html",
        {
            "trace": trace,
            "trace_gate": gate.number == TRACE_GATE,
            "can_upload_trace": access.offers(pilot, request.user, Act.UPLOAD_TRACE, gate),
            "trace_form": TraceUploadForm(),
            "can_download_trace": access.offers(pilot, request.user, Act.TAKE_RAW_DATA, pilot),
            "replayed": trace_of_job(evaluation.job) if evaluation is not None and gate.number == TRACE_GATE else None,
            "pilot": pilot,
            "gate": gate,
            "evaluation": evaluation,
            "result": result,
            "criteria": _criteria_view(gate, result, translation.get_language() or "en"),
            "validity": result.get("validity") or {},
            "charts": _charts(evaluation),
            "runs": runs,
            "signoffs": signoffs,
            "can_sign_off": can_sign_off,
            "signoff_form": GateSignOffForm(),
            "sign_party_label": Party(party).label if party else "",
            "can_extend": access.offers(pilot, request.user, Act.EXTEND_GATE, gate),
            "extended": extension_history(evaluation),
            "can_start": access.offers(pilot, request.user, Act.START_RUN, gate),
            "reports": _versions(gate.reports.select_related("gate", "countersigned_by")),
        },
    )


@login_required
@require_POST
def gate_trace(request: HttpRequest, code: UUID, number: int) -> HttpResponse:
    """The customer's session trace for G4, uploaded by either party before the run."""
    gate = get_gate_for_user(request, code, number)
    roles = access.require_act(gate.pilot, request.user, Act.UPLOAD_TRACE)
    trace = receive_upload(request, gate.pilot, gate, roles)
    if trace is not None:
        return redirect("pilot_trace", gate.pilot.code, trace.pk)
    return redirect("gate", gate.pilot.code, gate.number)


@login_required
def gate_trace_download(request: HttpRequest, code: UUID, number: int, trace: int) -> HttpResponse:
    """The uploaded trace from the evidence store, re-hashed as it streams (404 if it no longer matches)."""
    gate = get_gate_for_user(request, code, number)
    access.require_act(gate.pilot, request.user, Act.TAKE_RAW_DATA)
    row = get_object_or_404(gate.traces, pk=trace)
    return access.serve_stored(row.path, row.sha256, filename=row.name, content_type="text/csv", size=row.size)


@login_required
@require_POST
def gate_signoff(request: HttpRequest, code: UUID, number: int) -> HttpResponse:
    gate = get_gate_for_user(request, code, number)
    access.require_act(gate.pilot, request.user, Act.SIGN_OFF_GATE)
    form = GateSignOffForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            messages.error(request, " ".join(errors))
        return redirect("gate", gate.pilot.code, gate.number)
    try:
        signoff = lifecycle.sign_off_gate(
            gate, request.user, decision=form.cleaned_data["decision"], comment=form.cleaned_data["comment"]
        )
    except lifecycle.TransitionRefused as refused:
        messages.error(request, refused.message)
    else:
        messages.success(request, _("Your decision is recorded."))
        _render_again(request, signoff)
        _finish(request, gate)
        notifications.sweep([Pilot.objects.get(pk=gate.pilot_id)])
    return redirect("gate", gate.pilot.code, gate.number)


def _language(request: HttpRequest) -> str:
    return "zh-hans" if (translation.get_language() or "en").startswith("zh") else "en"


def _render_again(request: HttpRequest, signoff: SignOff) -> None:
    """A decision changes what the gate's report states (the gate's state, the sign-offs): a worker renders a new
    version of each language's report of that evidence, the one a customer approver then reads and countersigns."""
    languages = (Report.objects.filter(gate=signoff.gate, evaluation=signoff.evaluation, kind=Report.Kind.GATE)
                 .values_list("language", flat=True).distinct())
    for language in sorted(set(languages)):
        report_tasks.queue(ReportJob.Kind.RENDER, pilot=signoff.pilot, report_kind=Report.Kind.GATE, language=language,
                           who=request.user, gate=signoff.gate, evaluation=signoff.evaluation)
    if languages:
        messages.info(request, _("A worker renders the gate report again with this decision; the reports list shows "
                                 "the new version when it is ready."))


def _finish(request: HttpRequest, gate: Gate) -> None:
    """G4 signed off by both parties: the procurement report is the pilot's last act, rendered by a worker; the
    customer approver is then asked to read and countersign it (runners.pending)."""
    gate.refresh_from_db()
    if gate.number != TRACE_GATE or gate.state != Gate.State.SIGNED_OFF:
        return
    report_tasks.queue(ReportJob.Kind.RENDER, pilot=gate.pilot, report_kind=Report.Kind.PROCUREMENT,
                       language=_language(request), who=request.user)
    messages.success(request, _("The pilot is complete: a worker makes the procurement report, which the overview "
                                "then shows; the customer approver is asked to read and countersign it."))


@login_required
@require_POST
def procurement_make(request: HttpRequest, code: UUID) -> HttpResponse:
    """The procurement report on demand, for the vendor lead: rendered by a worker, followed on its job's page."""
    pilot = get_pilot_for_user(request, code)
    access.require_act(pilot, request.user, Act.MAKE_PROCUREMENT)
    job = report_tasks.queue(ReportJob.Kind.RENDER, pilot=pilot, report_kind=Report.Kind.PROCUREMENT,
                             language=_language(request), who=request.user)
    return redirect("report_job", job.code)


@login_required
def report_job(request: HttpRequest, code: UUID) -> HttpResponse:
    """A report job's page: "working…" (polled with htmx) until the worker is done, then its outcome. Members of
    the job's pilot only (404 for anyone else)."""
    job = get_object_or_404(ReportJob.objects.select_related("pilot", "result", "source", "gate"), code=code,
                            pilot__in=Pilot.objects.for_user(request.user))
    offered = job.result if job.state in (ReportJob.State.DONE, ReportJob.State.STALE) else None
    context = {"job": job, "pilot": job.pilot, "offered": offered, "poll_seconds": 2,
               "can_countersign": offered is not None and offered.countersigned_by_id is None
               and access.offers(job.pilot, request.user, Act.COUNTERSIGN, job.pilot)}
    if request.headers.get("HX-Request"):
        return render(request, "gates/_report_job.html", context)
    return render(request, "gates/report_job.html", context)


@login_required
@require_POST
def gate_extend(request: HttpRequest, code: UUID, number: int) -> HttpResponse:
    gate = get_gate_for_user(request, code, number)
    access.require_act(gate.pilot, request.user, Act.EXTEND_GATE)
    try:
        lifecycle.extend_gate(gate, request.user)
    except lifecycle.TransitionRefused as refused:
        messages.error(request, refused.message)
    else:
        messages.success(request, _("The gate is open again for a run with more repetitions."))
    return redirect("gate", gate.pilot.code, gate.number)


# ── Reports ───────────────────────────────────────────────────────────────────────────────────


@login_required
def report_download(request: HttpRequest, code: UUID) -> HttpResponse:
    # A signed report attaches the raw data: the same capability as an artifact (docs/portal.md).
    return access.serve_report(access.get_report_for_user(request, code, may=access.RAW_DATA))


@login_required
def reports_list(request: HttpRequest, code: UUID) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    reports = _versions(Report.objects.filter(pilot=pilot).select_related("gate", "countersigned_by"))
    return render(request, "gates/reports.html", {"pilot": pilot, "reports": reports,
                                                  "can_countersign": access.offers(pilot, request.user, Act.COUNTERSIGN, pilot)})


def _versions(queryset) -> list[Report]:
    """Reports with `final` (countersigned, not superseded) and `superseded` marked, latest versions first."""
    reports = list(queryset)
    superseded = {r.supersedes_id for r in reports if r.supersedes_id}
    for report in reports:
        report.superseded = report.pk in superseded
        report.final = report.countersigned_by_id is not None and not report.superseded
    return sorted(reports, key=lambda r: (r.superseded, -r.created.timestamp()))


def _throttled(request: HttpRequest, report: Report | None = None) -> HttpResponse:
    """429: the person asked for FXPILOT_CHECKS_PER_HOUR checks (uploads and stored reports) in the last hour."""
    limit = settings.FXPILOT_CHECKS_PER_HOUR
    throttled = translation.ngettext(
        "You have asked for %(n)d check in the last hour, the most one person may. Try again later.",
        "You have asked for %(n)d checks in the last hour, the most one person may. Try again later.",
        limit) % {"n": limit}
    return render(request, "gates/verify.html", {"form": PdfUploadForm(), "throttled": throttled, "report": report,
                                                 "max_mb": max_report_bytes() // 2**20}, status=429)


@login_required
def report_verify(request: HttpRequest) -> HttpResponse:
    """Upload a PDF: kept in the upload area with its SHA-256 and verified by a worker; the page follows it.
    A person may ask for FXPILOT_CHECKS_PER_HOUR checks an hour; beyond, 429 and the time to wait."""
    if request.method == "POST" and not checks_left(request.user):
        return _throttled(request)
    form = PdfUploadForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        row = queue_upload_verification(form.cleaned_data["file"], request.user)
        return redirect("report_verification", code=row.code)
    return render(request, "gates/verify.html", {"form": form, "max_mb": max_report_bytes() // 2**20})


def _error_text(row: UploadVerification) -> str:
    """A check's reason for `error` in the reader's language, as the worker made it (a sentence and its values, in
    `result`); a row stored before reasons were kept so shows its English."""
    reason = (row.result or {}).get("reason") if isinstance(row.result, dict) else None
    return findings.in_language(reason) if isinstance(reason, dict) and "template" in reason else row.error


@login_required
def report_verification(request: HttpRequest, code: UUID) -> HttpResponse:
    """One check's page — an uploaded PDF or a stored report: "verifying…" (polled with htmx) until the worker is
    done, then its result. Only the person who asked (404 for anyone else, and for a stored report of a pilot he
    no longer belongs to)."""
    row = get_object_or_404(UploadVerification.objects.select_related("report__pilot", "report__gate"), code=code,
                            requested_by=request.user)
    if row.report_id is not None and not Report.objects.for_user(request.user).filter(pk=row.report_id).exists():
        raise Http404
    context = {"form": PdfUploadForm(), "max_mb": max_report_bytes() // 2**20, "verification": row,
               "report": row.report,
               "result": row.result if row.state == UploadVerification.State.DONE else None,
               "error": _error_text(row) if row.state == UploadVerification.State.ERROR else None,
               "poll_seconds": 2}
    if request.headers.get("HX-Request"):
        return render(request, "gates/_verification.html", context)
    return render(request, "gates/verify.html", context)


@login_required
def report_check(request: HttpRequest, code: UUID) -> HttpResponse:
    """The same checks on a stored report, as it is in the evidence store now, by a worker on the checks' queue:
    GET offers the check, POST queues it (counted against the same hourly limit as an upload) and the page of the
    check follows the worker. Every member of the report's pilot (404 for anyone else)."""
    report = access.get_report_for_user(request, code)
    if request.method == "POST":
        if not checks_left(request.user):
            return _throttled(request, report)
        row = queue_report_check(report, request.user)
        return redirect("report_verification", code=row.code)
    return render(request, "gates/verify.html", {"form": PdfUploadForm(), "max_mb": max_report_bytes() // 2**20,
                                                 "report": report, "offer_check": True})


# ── The audit log ─────────────────────────────────────────────────────────────────────────────


@login_required
def audit_log(request: HttpRequest, code: UUID) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    page = Paginator(AuditEvent.objects.filter(pilot=pilot).select_related("actor"), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return render(request, "gates/audit.html", {"pilot": pilot, "page": page})


# ── The pilot's settings: the customer's traffic, the sizing unit, the deployment ──────────────────────────

SETTINGS_ROLES = frozenset({Role.VENDOR_LEAD, Role.VENDOR_ENGINEER, Role.CUSTOMER_APPROVER})
"""Who may change a pilot's settings: the vendor's people and the customer approver (viewers and the customer's
engineers read them)."""
MAX_CONCURRENCY = 100_000


def _settings_context(pilot: Pilot, request: HttpRequest, deployment_text: str | None = None) -> dict:
    deployment = pilot.deployment or {}
    return {
        "pilot": pilot, "can_edit": bool(policy.roles_of(pilot, request.user) & SETTINGS_ROLES),
        "concurrency_default": Pilot._meta.get_field("customer_concurrency").default,
        "sessions_default": Pilot._meta.get_field("sessions_kept").default,
        "unit_tb": (pilot.sizing or {}).get("fx_unit_usable_tb"),
        "unit_basis": (pilot.sizing or {}).get("fx_unit_usable_tb_basis") or "stated",
        "deployment_text": deployment_text if deployment_text is not None else (
            yaml.safe_dump(deployment, sort_keys=False, allow_unicode=True) if deployment else ""),
    }


def _whole(value: str, name: str, low: int, high: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValidationError(_("%(name)s: %(value)s is not a whole number") % {"name": name, "value": value}) from None
    if not low <= number <= high:
        raise ValidationError(_("%(name)s: %(value)s must be between %(low)s and %(high)s") % {
            "name": name, "value": number, "low": low, "high": f"{high:,}"})
    return number


@login_required
def pilot_settings(request: HttpRequest, code: UUID) -> HttpResponse:
    """The settings every prediction and the procurement report rest on — the customer's concurrency and sessions
    kept, one FX unit's usable capacity, the deployment settings — shown with their defaults, changed by the vendor's
    people or the customer approver, each change validated as `manage.py deployment --set` validates it and
    audited with both values."""
    pilot = get_pilot_for_user(request, code)
    if request.method != "POST":
        return render(request, "gates/pilot_settings.html", _settings_context(pilot, request))
    if not policy.roles_of(pilot, request.user) & SETTINGS_ROLES:
        raise PermissionDenied(_("Only the vendor lead, a vendor engineer or the customer approver may change the "
                                 "pilot's settings."))
    text = request.POST.get("deployment", "")
    try:
        concurrency = _whole(request.POST.get("customer_concurrency", ""), _("Customer concurrency"), 1, MAX_CONCURRENCY)
        sessions = _whole(request.POST.get("sessions_kept", ""), _("Sessions kept"), 1, 100_000_000)
        unit = (request.POST.get("fx_unit_usable_tb") or "").strip()
        sizing = dict(pilot.sizing or {})
        if unit:
            try:
                sizing["fx_unit_usable_tb"] = float(unit)
            except ValueError:
                raise ValidationError(_("FX unit usable capacity: %(value)s is not a number") % {"value": unit}) from None
            sizing["fx_unit_usable_tb_basis"] = request.POST.get("fx_unit_usable_tb_basis") or "stated"
        else:
            sizing.pop("fx_unit_usable_tb", None)
            sizing.pop("fx_unit_usable_tb_basis", None)
        try:
            validate_settings(sizing)
        except SizingSettingsError as exc:
            raise ValidationError(str(exc)) from None
        deployment = pilot.deployment or {}
        if text.strip():
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                raise ValidationError(_("Deployment settings, line %(line)s: not valid YAML or JSON (%(problem)s)") % {
                    "line": mark.line + 1 if mark else 1, "problem": getattr(exc, "problem", exc)}) from None
            if not isinstance(data, dict):
                raise ValidationError(_("Deployment settings: a mapping of settings is expected (docs/deployment.md)"))
            try:
                deployment = validate_deployment(data).to_dict()
            except DeploymentSettingsError as exc:
                raise ValidationError(str(exc)) from None
        elif pilot.deployment:
            raise ValidationError(_("Deployment settings: empty; a pilot's deployment settings are changed, not "
                                    "removed"))
    except ValidationError as error:
        for message in error.messages:
            messages.error(request, message)
        return render(request, "gates/pilot_settings.html", _settings_context(pilot, request, text), status=400)
    changes = {}
    for field, value in (("customer_concurrency", concurrency), ("sessions_kept", sessions), ("sizing", sizing),
                         ("deployment", deployment)):
        if getattr(pilot, field) != value:
            changes[field] = {"from": getattr(pilot, field), "to": value}
            setattr(pilot, field, value)
    if changes:
        with transaction.atomic():
            pilot.save(update_fields=list(changes))
            lifecycle.audit(pilot, request.user, AuditAction.PILOT_SIZING_SET, pilot, settings=changes)
        messages.success(request, _("Settings saved: %(fields)s. Reports made before this change are offered again "
                                    "as a new version.") % {"fields": ", ".join(sorted(changes))})
    else:
        messages.info(request, _("Nothing changed."))
    return redirect("pilot_settings", pilot.code)
