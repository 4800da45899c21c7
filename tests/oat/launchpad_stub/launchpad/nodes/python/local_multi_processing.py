"""Stand-in for launchpad's local multi-processing resources: records the environment of each process."""


class PythonProcess:
    def __init__(self, env=None, **kwargs):
        self.env, self.kwargs = env or {}, kwargs
