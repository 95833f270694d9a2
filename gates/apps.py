"""The gates app. `ready()` imports gates.passwords (models must be loaded first) to connect its signals."""
from django.apps import AppConfig


class GatesConfig(AppConfig):
    name = "gates"
    verbose_name = "Pilots and gates"

    def ready(self) -> None:
        from gates import passwords

        passwords.connect()
