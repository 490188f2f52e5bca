"""The HTTP service over the questions: response ``models``, query ``params``, the ``cache`` of
answers, the FastAPI ``app`` and its Ray Serve deployment (``serve``)."""
