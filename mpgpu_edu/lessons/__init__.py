"""What the notebooks run: small SPMD demos and figures for one lesson each.

Each module is named after its lesson's notebook: ``welcome`` (00), ``communication`` (01),
``parameter_server`` (02), ``data_parallel`` (03), ``pipeline`` (04), ``tensor_and_hybrid``
(05), ``choosing_and_debugging`` (06), ``many_machines`` (07), ``bigger_models`` (08). A
notebook never defines library code: the programs it launches and the helpers it calls that
belong to no other module live here, each a plain function that tests call directly; the
figures they draw live in ``mpgpu_edu.viz``.
"""
