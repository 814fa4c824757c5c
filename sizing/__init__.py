"""Sizing: how many copies of a model fit an instance (``mme capacity``), what a fleet of models
needs (``mme capacity --catalogue``) and the endpoint's cache simulated on a traffic mix.
Measured on the serving stack (serving/), below the load tests (bench/)."""
