"""plugin_app: a quickstart-pytorch style Flower app with LB-BSP plugged in."""
