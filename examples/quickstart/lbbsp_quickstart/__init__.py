"""lbbsp_quickstart: a Flower app with LB-BSP batch-size balancing."""
