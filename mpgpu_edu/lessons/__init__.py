"""What the notebooks run: small SPMD demos and figures for one lesson each.

``l00`` welcome and devices, ``l01`` communication, ``l02`` parameter server, ``l03`` data
parallel, ``l04`` pipeline, ``l05`` tensor and hybrid, ``l06`` choosing and debugging; from
lesson 07 on a module is named after its lesson: ``many_machines`` (07), ``bigger_models``
(08). A notebook never defines library code: the programs it launches and the figures it
draws that belong to no other module live here, each a plain function that tests call
directly.
"""
