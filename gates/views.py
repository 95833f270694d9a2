from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from gates.models import Pilot


@login_required
def home(request: HttpRequest) -> HttpResponse:
    pilots = Pilot.objects.for_user(request.user).select_related("customer", "vendor")
    return render(request, "gates/home.html", {"pilots": pilots})
