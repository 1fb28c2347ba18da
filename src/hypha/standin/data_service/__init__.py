"""The model store and data service (service), the embedded models and data (assets, lenet,
lenet_code)."""
