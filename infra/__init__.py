"""The ground under every floor, no Django app: the embedded message broker (infra.broker) and child processes that
do not outlive their parent (infra.lifetime). Nothing here imports a module of the project; the project (fxpilot)
and the apps that start processes (runners, portal) import it (docs/architecture.md)."""
