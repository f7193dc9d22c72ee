# A local geolog test cluster on loopback, built from the built-in
# terraform_data resource and local-exec provisioners only: no provider is
# downloaded, so `terraform init` works offline. See README.md beside this
# file for the port plan and what apply and destroy do.
terraform {
  # terraform_data arrived in 1.4; the Makefile installs 1.5.7 when
  # terraform is missing.
  required_version = ">= 1.4"
}
