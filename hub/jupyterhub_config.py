"""JupyterHub's settings for a labkit class: local system users, one server each on this machine.

    jupyterhub -f hub/jupyterhub_config.py        # as root, from the hub's environment (hub/requirements-hub.txt)

Every path and name comes from an environment variable with the default a machine set up as the kit says
would use (notebooks/README.md, "Running it on a JupyterHub"); .ci/hub runs the hub from this same file with
its own temporary paths. Learners' servers run from the learners' environment, the instructors' from theirs
(the grading tools are only there); each environment's etc/jupyter/ holds hub/jupyter_server_config.py.
"""
import os

c = get_config()  # noqa: F821 -- JupyterHub provides get_config


def _names(variable: str, default: str = "") -> set:
    return {n.strip() for n in os.environ.get(variable, default).split(",") if n.strip()}


LEARNER_ENV = os.environ.get("LABKIT_LEARNER_ENV", "/opt/labkit/learner")
INSTRUCTOR_ENV = os.environ.get("LABKIT_INSTRUCTOR_ENV", "/opt/labkit/instructor")
INSTRUCTORS = _names("LABKIT_INSTRUCTORS", "instructor")
LEARNERS = _names("LABKIT_LEARNERS")

# The hub and its proxy listen on the loopback address only; put a TLS-terminating proxy in front for a class.
c.JupyterHub.bind_url = os.environ.get("LABKIT_HUB_URL", "http://127.0.0.1:8000")
c.JupyterHub.hub_bind_url = os.environ.get("LABKIT_HUB_API_URL", "http://127.0.0.1:8081")
c.ConfigurableHTTPProxy.api_url = os.environ.get("LABKIT_PROXY_API_URL", "http://127.0.0.1:8001")
if os.environ.get("LABKIT_PROXY"):  # configurable-http-proxy from the npm registry, where it was installed
    c.ConfigurableHTTPProxy.command = [os.environ["LABKIT_PROXY"]]
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server
c.JupyterHub.cleanup_proxy = True
state = os.environ.get("LABKIT_HUB_STATE", "/srv/jupyterhub")  # the hub's database and cookie secret
c.JupyterHub.db_url = f"sqlite:///{os.path.join(state, 'jupyterhub.sqlite')}"
c.JupyterHub.cookie_secret_file = os.path.join(state, "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = os.path.join(state, "jupyterhub-proxy.pid")

# Local system users (PAM, the default authenticator); only the class may log in.
c.Authenticator.allowed_users = LEARNERS | INSTRUCTORS

# One single-user server per user, started as that user from the environment of the user's role.
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 180  # a first start imports torch from a cold disk
c.Spawner.http_timeout = 180


def choose_environment(spawner):
    env = INSTRUCTOR_ENV if spawner.user.name in INSTRUCTORS else LEARNER_ENV
    spawner.cmd = [os.path.join(env, "bin", "python"), "-m", "jupyterhub.singleuser"]
    # a terminal's `python`, `jupyter` and `nbgrader` are the role's; the chapters' kernels are that Python
    spawner.environment["PATH"] = os.pathsep.join([os.path.join(env, "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    spawner.environment["LABKIT_EXCHANGE"] = os.environ.get("LABKIT_EXCHANGE", "/srv/nbgrader/exchange")


c.Spawner.pre_spawn_hook = choose_environment

# A token for scripts that start and stop servers (.ci/hub sets one): a service allowed to manage users' servers.
if os.environ.get("LABKIT_HUB_API_TOKEN"):
    c.JupyterHub.services = [{"name": "labkit-admin", "api_token": os.environ["LABKIT_HUB_API_TOKEN"]}]
    c.JupyterHub.load_roles = [{"name": "labkit-admin", "services": ["labkit-admin"],
                                "scopes": ["admin:users", "admin:servers", "access:servers", "list:users"]}]
